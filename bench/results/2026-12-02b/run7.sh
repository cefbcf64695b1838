# thirteenth session, run 7: fla's decode step and branch by branch with beta passed by keyword (before, beta went
# into fla 0.6.0's fifth parameter, gk), their outputs checked against float64; B = 64 and 1, N = 64, random
# trees, tf32.
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
LOG=$OUT/logs_run7.txt
timeout 250 python3 bench/gdn_tree.py --quick --modes tf32 --kinds random --fla-shapes 2 \
  --fla-budget-s 110 --budget-s 90 --out $OUT/gdn_tree_run7.json > /tmp/gt.log 2>&1
cat /tmp/gt.log >> $LOG; grep -E "^fla|^\| |^B=|budget" /tmp/gt.log | tail -10
