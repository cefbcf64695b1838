# Twentieth session, run 31: the ieee commit, tl.dot on the CUDA cores (the library's until now) against the rank-one
# form (ab27.py with AB_PRECISION=ieee: B = 64 random and chain, B = 1 random and chain); then the GPU tests of the
# GDN kernels and of the other files that reach them, with the rank-one ieee commit and the N = 128 ieee config
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench AB_PRECISION=ieee
LOG=$OUT/logs_run31.txt
D=bench/results/2026-12-02i
nvidia-smi --query-gpu=name --format=csv >> $LOG
for args in "64 random" "64 chain" "1 random" "1 chain"; do
  timeout 100 python3 $D/ab27.py $args > /tmp/a.log 2>&1
  echo "ab27.py $args rc $?" >> /tmp/a.log; cat /tmp/a.log >> $LOG
  grep -E "^\||rc |Error|err " /tmp/a.log | tail -7
done
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py tests/test_optimized_model.py \
  tests/test_conv_kernels.py tests/test_engine_optimized.py tests/test_gdn_decode.py tests/test_demo_gpu_path.py \
  > /tmp/t.log 2>&1
echo "pytest rc $?" >> /tmp/t.log; cat /tmp/t.log >> $LOG; tail -3 /tmp/t.log
