# Run 96: the GPU tests of the fused verify and the deferred commits (the record now rounds kpt / dp to tf32),
# then run 95 (the switch variants of the library's fused verify, the probe's FOLD 28)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run96.txt
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gdn_fused.py tests/test_gdn_pending.py \
  >> $LOG 2>&1
echo "gpu tests rc $?" >> $LOG
grep -E "passed|failed|assert" $LOG | tail -8
OUT=$OUT bash bench/results/2026-12-03h/run95.sh
