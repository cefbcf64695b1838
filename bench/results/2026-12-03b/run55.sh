# Twenty-third session, run 55: the N = 128 solve's warps with the inverse by halves (ab55.py)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run55.txt
timeout 170 python3 bench/results/2026-12-03b/ab55.py >> $LOG 2>&1
echo "ab55 rc $?" >> $LOG
grep -E "rc |Error|^\\| |^B = " $LOG
