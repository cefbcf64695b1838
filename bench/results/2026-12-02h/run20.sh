# nineteenth session, run 20: run 19 again (loads moved ahead of the waits they do not depend on, early_loads.diff,
# against HEAD's kernels: the diff reversed on a copy; ab19.py, five rounds, B = 1 / 64 / 16), with the one-head
# solve's gates and depths loaded before its K loop but used after it (run 19 used them before it: the B = 1 verify
# got ~1 us slower), and that GATES_FIRST off in a copy to isolate it (ab19.py ... isolate); then the benchmark
# (fp32, tf32, random trees, fla-core 0.6.0 in the same run) and the GPU tests of the GDN kernels (run 19 also ran
# the model's, past the limit), on the library with the changes
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
LOG=$OUT/logs_run20.txt
D=bench/results/2026-12-02h
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
cp optimized/gdn_tree.py /tmp/old_gdn_tree.py && patch -s -R /tmp/old_gdn_tree.py < $D/early_loads.diff \
  && echo "old kernels restored" >> $LOG
for B in 1 64; do
  timeout 100 python3 $D/ab19.py $B /tmp/old_gdn_tree.py isolate > /tmp/a_$B.log 2>&1
  echo "ab19.py $B rc $?" >> /tmp/a_$B.log; cat /tmp/a_$B.log >> $LOG; grep -E "^\||rc |Error|diff" /tmp/a_$B.log | tail -9
done
timeout 190 python3 bench/gdn_tree.py --quick --modes tf32 --kinds random --fla-shapes 2 \
  --fla-budget-s 90 --budget-s 70 --out $OUT/gdn_tree_run20.json > /tmp/gt.log 2>&1
echo "rc $?" >> /tmp/gt.log
cat /tmp/gt.log >> $LOG; grep -E "^\| |budget|^rc|Error" /tmp/gt.log | tail -8
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py \
  > /tmp/t.log 2>&1
echo "pytest rc $?" >> /tmp/t.log; cat /tmp/t.log >> $LOG; tail -4 /tmp/t.log
B=16; timeout 60 python3 $D/ab19.py $B /tmp/old_gdn_tree.py isolate > /tmp/a_$B.log 2>&1
echo "ab19.py $B rc $?" >> /tmp/a_$B.log; cat /tmp/a_$B.log >> $LOG; grep -E "^\||rc |Error" /tmp/a_$B.log | tail -6
