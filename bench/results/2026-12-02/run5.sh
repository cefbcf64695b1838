# twelfth session, run 5: the commit with its first path chunk requested before the state tile. GPU tests of the GDN
# kernels, the side-by-side commit probe (the kernel as committed before: gdn_tree_before.py), then issue 5's
# benchmark on this code (B = 64 and 1, N = 64, tf32, fla baselines in child processes).
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
LOG=$OUT/logs_run5.txt
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py > /tmp/pytest.log 2>&1
cat /tmp/pytest.log >> $LOG; grep -E "passed|failed|Error|assert" /tmp/pytest.log | tail -12
timeout 120 python3 bench/results/2026-12-02/commit_first_chunk_probe.py --out $OUT/commit_first_chunk.json 2>&1 \
  | tee -a $LOG | tail -8
timeout 230 python3 bench/gdn_tree.py --quick --modes tf32 --kinds random chain eagle star --fla-shapes 2 \
  --fla-budget-s 40 --budget-s 150 --out $OUT/gdn_tree.json > /tmp/gt.log 2>&1
cat /tmp/gt.log >> $LOG; grep -E "^\| (64|1) \|" /tmp/gt.log
