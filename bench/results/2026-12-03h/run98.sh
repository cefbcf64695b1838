# Run 97: the fused verify computing log Gamma / the doubling count itself (no preparation kernel) and the
# record per (request, key head) (kpt once per key head, w on the Delta rows): GPU tests, bench/gdn_fused.py,
# the step's profile
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run98.txt
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gdn_fused.py tests/test_gdn_pending.py \
  >> $LOG 2>&1
echo "gpu tests rc $?" >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 200 python3 bench/gdn_fused.py --batches 64 32 8 \
  --out $OUT/gdn_fused_run98.json >> $LOG 2>&1
echo "gdn_fused rc $?" >> $LOG
timeout 120 python3 bench/results/2026-12-03h/profile_step.py --out $OUT/profile_run98.json >> $LOG 2>&1
echo "profile rc $?" >> $LOG
grep -E '^\||passed|failed|^E  |Error| rc |us' $LOG | grep -v "^E .*tensor(" | tail -45
