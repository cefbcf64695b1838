# Twenty-first session, run 38: the benchmark with the descriptor defaults (solve q / k everywhere, the apply's tiles
# from N = 64 at large batches) in every precision mode (fp32 inputs, random trees, B = 64 and 1, N = 64, fla-core
# 0.6.0 in the same run), then the GPU tests of every file
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
LOG=$OUT/logs_run38.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
timeout 330 python3 bench/gdn_tree.py --quick --modes tf32 tf32x3 ieee --kinds random --fla-shapes 2 \
  --fla-budget-s 90 --budget-s 200 --out $OUT/gdn_tree_run38.json > /tmp/gt.log 2>&1
echo "rc $?" >> /tmp/gt.log
cat /tmp/gt.log >> $LOG; grep -E "^\| |budget|^rc|Error" /tmp/gt.log | tail -8
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py tests/test_gemv.py \
  tests/test_optimized_model.py tests/test_conv_kernels.py tests/test_engine_optimized.py tests/test_gdn_decode.py \
  tests/test_demo_gpu_path.py tests/test_tree_attention.py >> $LOG 2>&1
echo "pytest rc $?" >> $LOG
tail -5 $LOG
