# Twenty-third session, run 48 (with persistent_apply.patch applied): the persistent apply (ab48.py), then the GPU
# tests of the GDN kernels
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run48.txt
timeout 300 python3 bench/results/2026-12-03b/ab48.py >> $LOG 2>&1
echo "ab48 rc $?" >> $LOG
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_gdn_kernels.py >> $LOG 2>&1
echo "pytest rc $?" >> $LOG
grep -E "rc |passed|failed|Error|^\\| |^B = " $LOG
