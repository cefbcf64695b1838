# Twentieth session, run 27: the rank-one commit (KernelConfig.rank_one) against the library's tl.dot commit
# (ab27.py: B = 64 random and chain, B = 16, B = 1; five interleaved rounds each)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run27.txt
D=bench/results/2026-12-02i
nvidia-smi --query-gpu=name --format=csv >> $LOG
for args in "64 random" "64 chain" "1 random" "16 random"; do
  timeout 170 python3 $D/ab27.py $args > /tmp/a.log 2>&1
  echo "ab27.py $args rc $?" >> /tmp/a.log; cat /tmp/a.log >> $LOG
  grep -E "^\||rc |Error|err " /tmp/a.log | tail -12
done
