# thirteenth session, run 5: branch by branch with one spare path after the inputs' end (fla's fused_recurrent had
# faulted on these batches), its outputs checked against the float64 closed form; B = 64 and 1, N = 64, random and
# EAGLE trees, tf32.
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
LOG=$OUT/logs_run5.txt
timeout 480 python3 bench/gdn_tree.py --quick --modes tf32 --kinds random eagle --fla-shapes 2 \
  --fla-budget-s 180 --budget-s 150 --out $OUT/gdn_tree_run5.json > /tmp/gt.log 2>&1
cat /tmp/gt.log >> $LOG; grep -E "^fla|^\| |^B=|budget" /tmp/gt.log | tail -16
python3 -c "
import json; d = json.load(open('$OUT/gdn_tree_run5.json'))
for k, v in d['fla_runs'].items(): print(k, v.get('status'), v.get('us'), v.get('err_o'))"
