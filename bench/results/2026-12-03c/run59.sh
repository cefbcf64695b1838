# Twenty-fifth session, run 59: the split solve by row halves at N = 128 (ab59.py), errors against float64 and
# same-run A / Bs, then the GPU tests of the GDN kernels file
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run59.txt
timeout 420 python3 bench/results/2026-12-03c/ab59.py >> $LOG 2>&1
echo "ab59 rc $?" >> $LOG
grep -E "rc |Error|error|^\\| |err o" $LOG | tail -60
