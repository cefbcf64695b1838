# Twentieth session, run 33: ieee at N = 128 with the solve's doubling streamed from scratch (ab33.py at B = 64 and 1
# against the committed library, kept as the old module), then the GPU tests of the GDN kernels
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run33.txt
D=bench/results/2026-12-02i
nvidia-smi --query-gpu=name --format=csv >> $LOG
patch -s -R -o /tmp/old_gdn_tree.py optimized/gdn_tree.py < $D/streamed_doubling.diff && echo "old kernels rebuilt" >> $LOG
for b in 64 1; do
  timeout 110 python3 $D/ab33.py $b /tmp/old_gdn_tree.py > /tmp/a.log 2>&1
  echo "ab33.py $b rc $?" >> /tmp/a.log; cat /tmp/a.log >> $LOG
  grep -E "^\||rc |Error|diff" /tmp/a.log | tail -6
done
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py > /tmp/t.log 2>&1
echo "pytest rc $?" >> /tmp/t.log; cat /tmp/t.log >> $LOG; tail -3 /tmp/t.log
