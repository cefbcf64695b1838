# Twenty-seventh session, run 65: HEAD 5b63cf0 (tf32x3's large-batch 4-warp rows solve since f5384ab): the GPU
# tests of every file with GPU tests, then every default verify + commit launch under compute-sanitizer memcheck
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run65.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
timeout 260 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_gdn_kernels.py tests/test_gemv.py \
  tests/test_optimized_model.py tests/test_conv_kernels.py tests/test_engine_optimized.py tests/test_gdn_decode.py \
  tests/test_demo_gpu_path.py tests/test_tree_attention.py >> $LOG 2>&1
echo "pytest rc $?" >> $LOG
timeout 260 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --print-limit 8 python3 bench/sanitize_gdn.py \
  >> $LOG 2>&1
echo "sanitizer rc $?" >> $LOG
grep -vE "Host Frame|^=========\s*$" $LOG | grep -E "rc |diff|Error|ERROR|passed|failed|B=|Out-of|at _" | tail -80
timeout 120 python3 bench/results/2026-12-03e/commit_probe.py >> $LOG 2>&1
echo "commit_probe rc $?" >> $LOG
grep -E "^\| |copy rate|rc " $LOG | tail -14
