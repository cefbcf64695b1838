# Run 109 (prepared, not run: no device time left): the record at 4 warps and 64 registers (run 108's best;
# set RECORD_WARPS = 4, RECORD_MAX_REGISTERS = 64 in optimized/gdn_tree_pending.py first): GPU tests, bench/gdn_fused.py
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run109.txt
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 110 python3 bench/gdn_fused.py --batches 64 32 16 8 1 \
  --out $OUT/gdn_fused_run109.json >> $LOG 2>&1
echo "gdn_fused rc $?" >> $LOG
timeout 70 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gdn_fused.py tests/test_gdn_pending.py \
  >> $LOG 2>&1
echo "gpu tests rc $?" >> $LOG
grep -E '^\||passed|failed|^E  |rc |Error' $LOG | grep -v "^E .*tensor(" | tail -24
