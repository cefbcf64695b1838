# Twentieth session, run 28: the benchmark in every precision mode (fp32 inputs, random trees, B = 64 and 1, N = 64,
# fla-core 0.6.0 in the same run): the tf32x3 and ieee timings had last been taken in the thirteenth session
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
LOG=$OUT/logs_run28.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
timeout 540 python3 bench/gdn_tree.py --quick --modes tf32 tf32x3 ieee --kinds random --fla-shapes 2 \
  --fla-budget-s 90 --budget-s 300 --out $OUT/gdn_tree_run28.json > /tmp/gt.log 2>&1
echo "rc $?" >> /tmp/gt.log
cat /tmp/gt.log >> $LOG; grep -E "^\| |budget|^rc|Error" /tmp/gt.log | tail -8
