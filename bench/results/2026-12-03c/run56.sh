# Twenty-fifth session, run 56: the GPU tests of every file with GPU tests on 18a40dc (the apply's scratch offsets
# through _scratch_tile), then bench/gdn_tree.py's first GPU run with --dtype bf16 beside fp32 in the same call
# (--quick: B = 64 and 1, N = 64; random and EAGLE-like trees; tf32), fla-core 0.6.0 in the same runs
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run56.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -n 8 tests/test_gdn_kernels.py tests/test_gemv.py \
  tests/test_optimized_model.py tests/test_conv_kernels.py tests/test_engine_optimized.py tests/test_gdn_decode.py \
  tests/test_demo_gpu_path.py tests/test_tree_attention.py >> $LOG 2>&1
echo "pytest rc $?" >> $LOG
export PYTHONPATH=$PYTHONPATH:/tmp/site
for dt in bf16 fp32; do
  timeout 140 python3 bench/gdn_tree.py --quick --dtype $dt --modes tf32 --kinds random eagle --fla-shapes 2 \
    --fla-budget-s 60 --budget-s 60 --out $OUT/gdn_tree_run56_$dt.json >> $LOG 2>&1
  echo "bench $dt rc $?" >> $LOG
done
grep -E "rc |passed|failed|Error|^\| " $LOG | tail -40
