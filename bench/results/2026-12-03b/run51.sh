# Twenty-third session, run 51: N = 128, each kernel alone and the launch shapes of the solve and the apply (ab51.py)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run51.txt
timeout 420 python3 bench/results/2026-12-03b/ab51.py >> $LOG 2>&1
echo "ab51 rc $?" >> $LOG
grep -E "rc |Error|^\\| |^B = " $LOG
