# sixteenth session, run 12: per-group ready counters between the solve and the apply (KernelConfig.apply_flags)
# against the grid-wide PDL wait, B = 64 and 16, every graph alive (each form twice); then the GPU test of both forms
# (bit for bit as plain launches, eager and graph replays)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run12.txt
D=bench/results/2026-12-02e
for b in 64 16; do
  timeout 50 python3 $D/ab.py $b flags > /tmp/a.log 2>&1
  echo "ab.py $b flags rc $?" >> /tmp/a.log; cat /tmp/a.log >> $LOG; grep -E "^\||rc |Error|err o" /tmp/a.log | tail -9
done
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gdn_kernels.py -k apply_pdl > /tmp/t.log 2>&1
echo "pytest rc $?" >> /tmp/t.log; cat /tmp/t.log >> $LOG; tail -3 /tmp/t.log
