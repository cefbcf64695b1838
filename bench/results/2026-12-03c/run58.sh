# Twenty-fifth session, run 58: verify launch configs on bf16 inputs (ab58.py), then bench/gdn_tree.py --quick
# --dtype bf16 with the torch bf16 error column (err_o_torch16), fla-core 0.6.0 in the same run
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run58.txt
timeout 300 python3 bench/results/2026-12-03c/ab58.py >> $LOG 2>&1
echo "ab58 rc $?" >> $LOG
export PYTHONPATH=$PYTHONPATH:/tmp/site
timeout 200 python3 bench/gdn_tree.py --quick --dtype bf16 --modes tf32 --kinds random eagle --fla-shapes 2 \
  --fla-budget-s 80 --budget-s 80 --out $OUT/gdn_tree_run58_bf16.json >> $LOG 2>&1
echo "bench bf16 rc $?" >> $LOG
grep -E "rc |Error|^\| |^B = .*default" $LOG | tail -50
