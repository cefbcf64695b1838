# Twenty-sixth session, run 62: the solve by row halves with C through an fp32 workspace (run 61's fault fixed?) and
# as the N = 128 defaults: probe61's six forms, every default rows launch under compute-sanitizer, the same-run A / B
# against the old defaults, then the GPU tests of every file with GPU tests
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run62.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
timeout 120 python3 bench/results/2026-12-03c/probe61.py >> $LOG 2>&1
echo "probe rc $?" >> $LOG
timeout 200 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --print-limit 8 python3 \
  bench/results/2026-12-03d/sanitize62.py >> $LOG 2>&1
echo "sanitizer rc $?" >> $LOG
timeout 220 python3 bench/results/2026-12-03d/ab62.py >> $LOG 2>&1
echo "ab62 rc $?" >> $LOG
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_gdn_kernels.py tests/test_gemv.py \
  tests/test_optimized_model.py tests/test_conv_kernels.py tests/test_engine_optimized.py tests/test_gdn_decode.py \
  tests/test_demo_gpu_path.py tests/test_tree_attention.py >> $LOG 2>&1
echo "pytest rc $?" >> $LOG
grep -vE "Host Frame|^=========\s*$" $LOG | grep -E "rc |: rc|B=|B = |Error|ERROR|^\| |passed|failed|Out-of|at _" | tail -90
