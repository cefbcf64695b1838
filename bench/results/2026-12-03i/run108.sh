# Run 108: the record's launch (a register cap, warps) and value-head loop, in the step; a 3-slot solve ring
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run108.txt
timeout 280 python3 bench/results/2026-12-03i/record_ab.py $OUT/record_ab_run108.json >> $LOG 2>&1
echo "record_ab rc $?" >> $LOG
grep -E 'verify |rc |Error' $LOG | tail -20
