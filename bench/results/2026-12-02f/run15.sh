# prepared in the seventeenth session for the next (not run: no device time left), run 15: the 64-column apply capped
# at 128 registers (4 programs per SM if the shared memory allows), with the commit launched late or early, at
# B = 64 / 32 / 16 (ab13.py cap; about 2 minutes)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run15.txt
D=bench/results/2026-12-02f
for B in 64 32 16; do
  timeout 90 python3 $D/ab13.py $B cap > /tmp/a.log 2>&1
  echo "ab13.py $B cap rc $?" >> /tmp/a.log; cat /tmp/a.log >> $LOG; grep -E "^\||rc |Error" /tmp/a.log | tail -10
done
