# Run 105: solve register budgets of the library kernel (doubling rounds + vector partition) and of the serial
# doubling with the vector partition (kernel_ab.py)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run105.txt
timeout 300 python3 bench/results/2026-12-03i/kernel_ab.py $OUT/kernel_ab_run105.json "library 184,serial 176,\
serial 184,library 176,serial 168,library 184,serial 176,serial 184,serial 192,serial 200,library 200,library 168" \
  >> $LOG 2>&1
echo "kernel_ab rc $?" >> $LOG
grep -E 'verify |rc |Error' $LOG | tail -20
