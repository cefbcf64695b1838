# Twenty-third session, run 49 (with lockstep_doubling.patch applied): the lockstep doubling (ab49.py, then its GPU
# test); where the verify's time goes now (gdn_profile.py: the solve alone, the apply alone, B = 64 / 16 / 1, N = 64)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run49.txt
timeout 240 python3 bench/results/2026-12-03b/ab49.py >> $LOG 2>&1
echo "ab49 rc $?" >> $LOG
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gdn_kernels.py -k lockstep >> $LOG 2>&1
echo "pytest rc $?" >> $LOG
timeout 200 python3 bench/gdn_profile.py --out $OUT/profile_run49.json >> $LOG 2>&1
echo "profile rc $?" >> $LOG
grep -E "rc |passed|failed|Error|^\\| |^B = |solve_only" $LOG
