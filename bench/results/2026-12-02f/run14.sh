# seventeenth session, run 14: the benchmark with the large-batch default after run 13 (64-column apply, commit
# launched as the apply exits: KernelConfig.early_signal), the GPU tests of the GDN kernels, then that default
# against the 32-column form at B = 64 (ab13.py wide); ordered by importance (little device time left)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
LOG=$OUT/logs_run14.txt
D=bench/results/2026-12-02f
timeout 200 python3 bench/gdn_tree.py --quick --modes tf32 --kinds random --fla-shapes 2 \
  --fla-budget-s 90 --budget-s 70 --out $OUT/gdn_tree_run14.json > /tmp/gt.log 2>&1
echo "rc $?" >> /tmp/gt.log
cat /tmp/gt.log >> $LOG; grep -E "^\| |budget|^rc|Error" /tmp/gt.log | tail -6
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py > /tmp/t.log 2>&1
echo "pytest rc $?" >> /tmp/t.log; cat /tmp/t.log >> $LOG; tail -4 /tmp/t.log
timeout 45 python3 $D/ab13.py 64 wide > /tmp/a.log 2>&1
echo "ab13.py 64 wide rc $?" >> /tmp/a.log; cat /tmp/a.log >> $LOG; grep -E "^\||rc |Error" /tmp/a.log | tail -6
