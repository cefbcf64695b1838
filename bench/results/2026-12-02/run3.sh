# (ran on the working tree with the reverted commit-kernel change and the deferred commit still present)
# twelfth session, run 3: GPU tests of the GDN kernels (the commit's state tile now loaded before the path's
# products; the apply a PDL launch by default up to N = 64), the commit config probe, apply PDL at N = 32 / 128,
# then issue 5's benchmark (B = 64 and 1, N = 64, tf32, fla baselines in child processes).
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
LOG=$OUT/logs_run3.txt
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py > /tmp/pytest.log 2>&1
cat /tmp/pytest.log >> $LOG; grep -E "passed|failed|Error|assert" /tmp/pytest.log | tail -12
timeout 120 python3 bench/results/2026-12-02/commit_probe.py --out $OUT/commit.json 2>&1 | tee -a $LOG | tail -4
timeout 60 python3 bench/results/2026-12-02/overlap_probe.py --shapes 64:32:float32 64:128:float32 \
  --out $OUT/overlap_n.json 2>&1 | tee -a $LOG | tail -3
timeout 230 python3 bench/gdn_tree.py --quick --modes tf32 --kinds random chain eagle star --fla-shapes 2 \
  --fla-budget-s 50 --budget-s 150 --out $OUT/gdn_tree.json > /tmp/gt.log 2>&1
cat /tmp/gt.log >> $LOG; grep -E "^\| (64|1) \|" /tmp/gt.log
