# seventeenth session, run 13: when the apply lets the commit launch (start / after its K loop / never) with 32- and
# 64-column apply blocks at B = 64 and 16; the apply at 16 columns and commit tilings at B = 1; the q / k hand-off
# (KernelConfig.qk_handoff) at all three (ab13.py)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run13.txt
D=bench/results/2026-12-02f
for args in "64 large" "1 small" "16 large"; do
  timeout 120 python3 $D/ab13.py $args > /tmp/a.log 2>&1
  echo "ab13.py $args rc $?" >> /tmp/a.log; cat /tmp/a.log >> $LOG; grep -E "^\||rc |Error|pool diff" /tmp/a.log | tail -20
done
