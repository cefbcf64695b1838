# Run 100: the record with its inputs loaded before the pending check (GPU tests, bench/gdn_fused.py at B = 64),
# then data_probe.py (the library kernel on the probe's inputs and four edited builds, the module swap done right)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run100.txt
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gdn_fused.py tests/test_gdn_pending.py \
  >> $LOG 2>&1
echo "gpu tests rc $?" >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 120 python3 bench/gdn_fused.py --batches 64 \
  --out $OUT/gdn_fused_run100.json >> $LOG 2>&1
echo "gdn_fused rc $?" >> $LOG
timeout 300 python3 bench/results/2026-12-03h/data_probe.py $OUT/data_probe_run100.json >> $LOG 2>&1
echo "data_probe rc $?" >> $LOG
grep -E '^\||passed|failed|^E  |Error| rc |verify ' $LOG | grep -v "^E .*tensor(" | tail -30
