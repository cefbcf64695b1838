# Twenty-third session, run 50: issue 5's benchmark on the committed code for the tree kinds runs 38 / 41 left out
# (EAGLE-like top-k trees and stars) at B = 64 and 1, N = 64, tf32, fla-core 0.6.0 in the same run
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
LOG=$OUT/logs_run50.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
timeout 500 python3 bench/gdn_tree.py --quick --modes tf32 --kinds eagle star --fla-shapes 2 --fla-budget-s 120 \
  --budget-s 400 --out $OUT/gdn_tree_run50.json >> $LOG 2>&1
echo "rc $?" >> $LOG
grep -E "^\| |budget|^rc|Error" $LOG | tail -40
