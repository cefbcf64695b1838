# Twentieth session, run 30: ieee mode at N = 128 (ab_ieee128.py at B = 64 and 1)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run30.txt
D=bench/results/2026-12-02i
nvidia-smi --query-gpu=name --format=csv >> $LOG
for b in 64 1; do
  timeout 270 python3 $D/ab_ieee128.py $b > /tmp/a.log 2>&1
  echo "ab_ieee128.py $b rc $?" >> /tmp/a.log; cat /tmp/a.log >> $LOG
  grep -E "^\||rc |Error|diff" /tmp/a.log | tail -9
done
