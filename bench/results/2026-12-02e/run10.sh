# sixteenth session, run 10: the apply at 3 stages and three commit tilings (ab.py tune) at B = 64 and 16, every
# variant's graphs alive (pools kept alive since run 8)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run10.txt
D=bench/results/2026-12-02e
for b in 64 16; do
  timeout 120 python3 $D/ab.py $b tune > /tmp/a.log 2>&1
  echo "ab.py $b tune rc $?" >> /tmp/a.log; cat /tmp/a.log >> $LOG; grep -E "^\||rc |Error" /tmp/a.log | tail -9
done
