# Twenty-third session, run 52: the inverse by diagonal halves (ab52.py), then its GPU tests
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run52.txt
timeout 420 python3 bench/results/2026-12-03b/ab52.py >> $LOG 2>&1
echo "ab52 rc $?" >> $LOG
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_gdn_kernels.py >> $LOG 2>&1
echo "pytest rc $?" >> $LOG
grep -E "rc |passed|failed|Error|^\\| |^B = " $LOG
