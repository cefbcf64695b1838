# thirteenth session, run 2: GPU tests with the split pipeline's operands stored as packed lower triangles, the probe
# (triangles against the committed two square tiles), then issue 5's benchmark (B = 64 and 1, N = 64, tf32, random
# and EAGLE trees) with fla's decode step and branch-by-branch given a longer budget.
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
LOG=$OUT/logs_run2.txt
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py tests/test_optimized_model.py \
  > /tmp/pytest.log 2>&1
cat /tmp/pytest.log >> $LOG; grep -E "passed|failed|Error|assert" /tmp/pytest.log | tail -12
timeout 120 python3 bench/results/2026-12-02b/pack_probe.py --old bench/results/2026-12-02b/old_gdn_tree.py \
  --name triangles --out $OUT/tri_run2.json > /tmp/probe.log 2>&1
cat /tmp/probe.log >> $LOG; tail -c 3500 /tmp/probe.log
timeout 300 python3 bench/gdn_tree.py --quick --modes tf32 --kinds random eagle --fla-shapes 2 \
  --fla-budget-s 130 --budget-s 130 --out $OUT/gdn_tree_run2.json > /tmp/gt.log 2>&1
cat /tmp/gt.log >> $LOG; grep -E "^fla|^\| |^B=" /tmp/gt.log | tail -20
