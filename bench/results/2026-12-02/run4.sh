# twelfth session, run 4 (the final code: deferred commit removed, commit kernel as before, the split pipeline's
# apply a PDL launch behind the solve by default): GPU tests of the GDN kernels, the conv kernels and the optimized
# model, then issue 5's benchmark (B = 64 and 1, N = 64, tf32, fla baselines in child processes).
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
LOG=$OUT/logs_run4.txt
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py tests/test_conv_kernels.py \
  tests/test_optimized_model.py > /tmp/pytest.log 2>&1
cat /tmp/pytest.log >> $LOG; grep -E "passed|failed|Error|assert" /tmp/pytest.log | tail -12
timeout 260 python3 bench/gdn_tree.py --quick --modes tf32 --kinds random chain eagle star --fla-shapes 2 \
  --fla-budget-s 50 --budget-s 170 --out $OUT/gdn_tree.json > /tmp/gt.log 2>&1
cat /tmp/gt.log >> $LOG; grep -E "^\| (64|1) \|" /tmp/gt.log
