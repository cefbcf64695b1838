# Twenty-third session, run 53: the inverse by halves in ieee at N = 128, and every mode's error with it (ab53.py)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run53.txt
timeout 400 python3 bench/results/2026-12-03b/ab53.py >> $LOG 2>&1
echo "ab53 rc $?" >> $LOG
grep -E "rc |Error|^\\| |^B = |^errors" $LOG
