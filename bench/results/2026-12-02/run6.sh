# twelfth session, run 6: issue 5's benchmark on the final code over the (B, N) shapes in priority order, tf32,
# random trees and chains, until its budget (the last of this session's device time).
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
timeout 370 python3 bench/gdn_tree.py --modes tf32 --kinds random chain --fla-shapes 3 --fla-budget-s 40 \
  --budget-s 250 --out $OUT/gdn_tree.json > $OUT/logs_run6.txt 2>&1
grep -E "^\| [0-9]+ \|" $OUT/logs_run6.txt
