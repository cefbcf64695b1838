# Twenty-fifth session, run 57: issue 5's benchmark on 18a40dc (N = 128 with the inverse by halves) over
# every (B, N) shape in priority order, tf32, random trees and chains, fla-core 0.6.0 in the same run
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
LOG=$OUT/logs_run57.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
timeout 540 python3 bench/gdn_tree.py --modes tf32 --kinds random chain --fla-shapes 3 --fla-budget-s 90 \
  --budget-s 360 --out $OUT/gdn_tree_run57.json >> $LOG 2>&1
echo "rc $?" >> $LOG
grep -E "^\| |budget|^rc|Error" $LOG | tail -40
