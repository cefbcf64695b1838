# fifteenth session, run 5 (final): the benchmark with the final library (fp16 scratch at small batches only, the
# solve's mask before its K loop); then ab.py at B = 16 with one variant's graphs alive at a time (run 4 faulted
# there with all eight graphs built before timing).
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
LOG=$OUT/logs_run5.txt
timeout 230 python3 bench/gdn_tree.py --quick --modes tf32 --kinds random --fla-shapes 2 \
  --fla-budget-s 100 --budget-s 80 --out $OUT/gdn_tree_run5.json > /tmp/gt.log 2>&1
echo "rc $?" >> /tmp/gt.log
cat /tmp/gt.log >> $LOG; grep -E "^\| |budget|^rc|Error" /tmp/gt.log | tail -6
timeout 60 python3 bench/results/2026-12-02d/ab.py 16 serial > /tmp/a.log 2>&1
echo "B 16 serial rc $?" >> /tmp/a.log; cat /tmp/a.log >> $LOG; grep -E "^\||rc |Error|timing" /tmp/a.log | tail -14
