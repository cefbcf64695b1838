# Twenty-first session, run 39: the descriptor apply's occupancy at B = 64 (ab35.py, AB_RUN=39), then the GPU tests
# of every file (run 38's timed out at 200 s)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run39.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
AB_RUN=39 timeout 150 python3 bench/results/2026-12-03/ab35.py >> $LOG 2>&1; echo "ab rc $?" >> $LOG
timeout 380 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 --durations=8 tests/test_gdn_kernels.py \
  tests/test_gemv.py tests/test_optimized_model.py tests/test_conv_kernels.py tests/test_engine_optimized.py \
  tests/test_gdn_decode.py tests/test_demo_gpu_path.py tests/test_tree_attention.py >> $LOG 2>&1
echo "pytest rc $?" >> $LOG
grep -E "^\| |rc |passed|failed|Error|FAIL" $LOG | tail -30
