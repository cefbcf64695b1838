# thirteenth session, run 4: the committed code (the packed layouts of runs 1-3 reverted), issue 5's benchmark at
# B = 64 and 1, N = 64, every precision mode, random trees and chains, fla's decode step, chunk kernel (on the chains)
# and branch-by-branch given a long budget (the chunk kernel autotunes for minutes in its child process).
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
LOG=$OUT/logs_run4.txt
timeout 570 python3 bench/gdn_tree.py --quick --modes tf32 tf32x3 ieee --kinds random chain --fla-shapes 2 \
  --fla-budget-s 270 --budget-s 200 --out $OUT/gdn_tree_run4.json > /tmp/gt.log 2>&1
cat /tmp/gt.log >> $LOG; grep -E "^fla|^\| |^B=|budget" /tmp/gt.log | tail -24
