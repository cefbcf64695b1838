# Twenty-sixth session, run 64: the doubling's first product in a region of its own (no over-covered product in
# the tf32 defaults): the GPU tests of every file with GPU tests, ab64.py, memcheck over the N = 64 / 128 defaults
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run64.txt
timeout 220 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_gdn_kernels.py tests/test_gemv.py \
  tests/test_optimized_model.py tests/test_conv_kernels.py tests/test_engine_optimized.py tests/test_gdn_decode.py \
  tests/test_demo_gpu_path.py tests/test_tree_attention.py >> $LOG 2>&1
echo "pytest rc $?" >> $LOG
timeout 200 python3 bench/results/2026-12-03d/ab64.py >> $LOG 2>&1
echo "ab64 rc $?" >> $LOG
timeout 100 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --print-limit 8 python3 bench/sanitize_gdn.py \
  --nodes 64 128 >> $LOG 2>&1
echo "sanitizer rc $?" >> $LOG
grep -vE "Host Frame|^=========\s*$" $LOG | grep -E "rc |^\| |diff|Error|ERROR|passed|failed|B=" | tail -80
