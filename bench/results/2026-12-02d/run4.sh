# fifteenth session, run 4: B = 64 / 16 / 1 A/B of fp16 scratch and the mask-first solve (ab.py), after run 3's
# benchmark measured B = 64 at 416.1 us against 401.9 in the fourteenth session.
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run4.txt
for b in 64 16 1; do
  timeout 90 python3 bench/results/2026-12-02d/ab.py $b > /tmp/a.log 2>&1
  echo "B $b rc $?" >> /tmp/a.log; cat /tmp/a.log >> $LOG; grep -E "^\||rc |Error" /tmp/a.log | tail -8
done
