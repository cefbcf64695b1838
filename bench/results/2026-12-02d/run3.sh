# fifteenth session, run 3 (final): which graph of the probe faults at B = 16 (--trace), the B = 64 variants without
# fla's graph; the benchmark with this session's library (fp16 scratch, the solve's mask before its K loop);
# B = 64 and 1, N = 64, random trees, tf32, fla baselines; the GDN GPU tests.
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
LOG=$OUT/logs_run3.txt
P=bench/results/2026-12-02d/probe.py
timeout 60 python3 $P --shape 2 --trace --rounds 1 --out $OUT/probe_run3_16.json > /tmp/p.log 2>&1
echo "shape 2 rc $?" >> /tmp/p.log; cat /tmp/p.log >> $LOG; grep -vE "built and checked" /tmp/p.log | tail -12
timeout 80 python3 $P --shape 3 --no-fla --out $OUT/probe_run3_64.json > /tmp/p.log 2>&1
echo "shape 3 rc $?" >> /tmp/p.log; cat /tmp/p.log >> $LOG; grep -E "^\||rc |Error" /tmp/p.log | tail -9
timeout 250 python3 bench/gdn_tree.py --quick --modes tf32 --kinds random --fla-shapes 2 \
  --fla-budget-s 100 --budget-s 90 --out $OUT/gdn_tree_run3.json > /tmp/gt.log 2>&1
echo "rc $?" >> /tmp/gt.log
cat /tmp/gt.log >> $LOG; grep -E "^fla|^\| |^B=|budget|^rc|Error" /tmp/gt.log | tail -14
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py > /tmp/t.log 2>&1
echo "pytest rc $?" >> /tmp/t.log; cat /tmp/t.log >> $LOG; tail -4 /tmp/t.log
