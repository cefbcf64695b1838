# Run 94: the fused step's time by kernel (profile_step.py), B = 64 and 8
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run94.txt
timeout 250 python3 bench/results/2026-12-03h/profile_step.py --out $OUT/profile_run94.json >> $LOG 2>&1
echo "profile rc $?" >> $LOG
cat $LOG | tail -40
