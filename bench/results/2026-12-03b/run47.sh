# Twenty-third session, run 47: the GPU tests of every file with GPU tests after the twenty-second session's last
# three commits (the dtype rule, the store helper, the descriptors' one builder); the fused kernel at B = 64 / 16
# with descriptors (ab47.py); the dtype rule as the model launches the verify (run 46's probe, not run then)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run47.txt
nvidia-smi --query-gpu=name --format=csv >> $LOG
timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_gdn_kernels.py tests/test_gemv.py \
  tests/test_optimized_model.py tests/test_conv_kernels.py tests/test_engine_optimized.py tests/test_gdn_decode.py \
  tests/test_demo_gpu_path.py tests/test_tree_attention.py >> $LOG 2>&1
echo "pytest rc $?" >> $LOG
timeout 150 python3 bench/results/2026-12-03b/ab47.py >> $LOG 2>&1
echo "ab47 rc $?" >> $LOG
timeout 130 python3 bench/gdn_profile.py --model-like --model-like-nodes 8 16 32 128 \
  --model-like-variants default default_pointers --budget-s 100 --out $OUT/model_like_run47.json >> $LOG 2>&1
echo "model-like rc $?" >> $LOG
grep -E "rc |passed|failed|Error|^\\| |^B = " $LOG
