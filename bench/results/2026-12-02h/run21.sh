# nineteenth session, run 21: the paired solve forming both heads' operands before either doubling (two_phase.diff:
# K K^T, Q K^T and the masks die before the doublings; compile-only, Triton 3.6, B = 64, N = 64: 264 -> 0 bytes of
# stack; the depth load after the operands again where the gates come after the K loop: N = 128 376 bytes, 400
# before the session) against run 20's kernels (the diff reversed on a copy; ab19.py, five rounds) at B = 64 / 16 / 1,
# N = 64, then the benchmark (fp32, tf32, random trees, fla-core 0.6.0 in the same run), the GPU tests of the GDN
# kernels, and the same A / B at B = 64, N = 128 and 32
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
LOG=$OUT/logs_run21.txt
D=bench/results/2026-12-02h
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
cp optimized/gdn_tree.py /tmp/old_gdn_tree.py && patch -s -R /tmp/old_gdn_tree.py < $D/two_phase.diff \
  && echo "old kernels restored" >> $LOG
for B in 64 16 1; do
  timeout 90 python3 $D/ab19.py $B /tmp/old_gdn_tree.py > /tmp/a_$B.log 2>&1
  echo "ab19.py $B rc $?" >> /tmp/a_$B.log; cat /tmp/a_$B.log >> $LOG; grep -E "^\||rc |Error|diff" /tmp/a_$B.log | tail -9
done
timeout 190 python3 bench/gdn_tree.py --quick --modes tf32 --kinds random --fla-shapes 2 \
  --fla-budget-s 90 --budget-s 70 --out $OUT/gdn_tree_run21.json > /tmp/gt.log 2>&1
echo "rc $?" >> /tmp/gt.log
cat /tmp/gt.log >> $LOG; grep -E "^\| |budget|^rc|Error" /tmp/gt.log | tail -8
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py \
  > /tmp/t.log 2>&1
echo "pytest rc $?" >> /tmp/t.log; cat /tmp/t.log >> $LOG; tail -4 /tmp/t.log
for n in 128 32; do
  AB_N=$n timeout 70 python3 $D/ab19.py 64 /tmp/old_gdn_tree.py > /tmp/a_n$n.log 2>&1
  echo "ab19.py 64 N $n rc $?" >> /tmp/a_n$n.log; cat /tmp/a_n$n.log >> $LOG; grep -E "^\||rc |Error" /tmp/a_n$n.log | tail -6
done
