# nineteenth session, run 22: the paired solve (now without spills, 255 registers, 2 programs per SM) capped at
# 168 registers (3 per SM; compile-only 424 bytes of stack) and 128 (4 per SM; 800 bytes) against the library
# (ab19.py B lib caps: "old" and "new" are both the library here), at B = 64 and 16, N = 64; then the benchmark
# (fp32, tf32, random trees, fla-core 0.6.0 in the same run) of the library
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
LOG=$OUT/logs_run22.txt
D=bench/results/2026-12-02h
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
for B in 64 16; do
  timeout 100 python3 $D/ab19.py $B optimized/gdn_tree.py caps > /tmp/a_$B.log 2>&1
  echo "ab19.py $B caps rc $?" >> /tmp/a_$B.log; cat /tmp/a_$B.log >> $LOG; grep -E "^\||rc |Error|diff" /tmp/a_$B.log | tail -9
done
timeout 190 python3 bench/gdn_tree.py --quick --modes tf32 --kinds random --fla-shapes 2 \
  --fla-budget-s 90 --budget-s 70 --out $OUT/gdn_tree_run22.json > /tmp/gt.log 2>&1
echo "rc $?" >> /tmp/gt.log
cat /tmp/gt.log >> $LOG; grep -E "^\| |budget|^rc|Error" /tmp/gt.log | tail -8
