# Twenty-third session, run 54: the GPU tests of every file with GPU tests on the final code (the inverse by halves
# the split solve's default past N = 64, the streamed ieee doubling removed)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run54.txt
nvidia-smi --query-gpu=name --format=csv >> $LOG
timeout 400 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_gdn_kernels.py tests/test_gemv.py \
  tests/test_optimized_model.py tests/test_conv_kernels.py tests/test_engine_optimized.py tests/test_gdn_decode.py \
  tests/test_demo_gpu_path.py tests/test_tree_attention.py >> $LOG 2>&1
echo "pytest rc $?" >> $LOG
grep -E "rc |passed|failed|Error" $LOG | tail -15
