# Twenty-second session, run 45: the descriptors at B = 1 by input dtype / layout and launch pattern (ab45.py)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run45.txt
timeout 400 python3 bench/results/2026-12-03/ab45.py >> $LOG 2>&1; echo "rc $?" >> $LOG
grep -E "^\||^B = |rc |Error" $LOG
