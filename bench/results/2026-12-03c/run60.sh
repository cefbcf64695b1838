# Twenty-fifth session, run 60: the new N = 128 defaults (solve by row halves) against the old ones (ab60.py), then
# the GPU tests of every file with GPU tests on the new defaults
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run60.txt
timeout 200 python3 bench/results/2026-12-03c/ab60.py >> $LOG 2>&1
echo "ab60 rc $?" >> $LOG
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_gdn_kernels.py tests/test_gemv.py \
  tests/test_optimized_model.py tests/test_conv_kernels.py tests/test_engine_optimized.py tests/test_gdn_decode.py \
  tests/test_demo_gpu_path.py tests/test_tree_attention.py >> $LOG 2>&1
echo "pytest rc $?" >> $LOG
grep -E "rc |Error|error|^\\| |err o|passed|failed" $LOG | tail -70
