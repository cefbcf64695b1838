# prepared in the sixteenth session for the next (not run: no device time left), run 12: per-group ready counters
# between the solve and the apply (KernelConfig.apply_flags) against the grid-wide PDL wait, B = 64 and 16, every
# graph alive (each form twice); 64-column apply blocks (ab.py bv64); then the GPU test of both wait forms (bit for
# bit as plain launches, eager and graph replays)
# the ready counters live in apply_flags.patch (kept out of the library until measured): applied to this copy first
git apply bench/results/2026-12-02e/apply_flags.patch || exit 1
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run12.txt
D=bench/results/2026-12-02e
for args in "64 flags" "16 flags" "64 bv64" "16 bv64"; do
  timeout 60 python3 $D/ab.py $args > /tmp/a.log 2>&1
  echo "ab.py $args rc $?" >> /tmp/a.log; cat /tmp/a.log >> $LOG; grep -E "^\||rc |Error|err o" /tmp/a.log | tail -9
done
timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gdn_kernels.py -k apply_pdl > /tmp/t.log 2>&1
echo "pytest rc $?" >> /tmp/t.log; cat /tmp/t.log >> $LOG; tail -3 /tmp/t.log
