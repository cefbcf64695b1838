# seventeenth session, run 14: the large-batch default after run 13 (64-column apply, commit launched as the apply
# exits: KernelConfig.early_signal) against the 32-column form at B = 32 / 64 (ab13.py wide), the benchmark, and the
# GPU tests of the GDN kernels and the model
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
LOG=$OUT/logs_run14.txt
D=bench/results/2026-12-02f
for B in 64 32; do
  timeout 45 python3 $D/ab13.py $B wide > /tmp/a.log 2>&1
  echo "ab13.py $B wide rc $?" >> /tmp/a.log; cat /tmp/a.log >> $LOG; grep -E "^\||rc |Error" /tmp/a.log | tail -6
done
timeout 200 python3 bench/gdn_tree.py --quick --modes tf32 --kinds random --fla-shapes 2 \
  --fla-budget-s 90 --budget-s 70 --out $OUT/gdn_tree_run14.json > /tmp/gt.log 2>&1
echo "rc $?" >> /tmp/gt.log
cat /tmp/gt.log >> $LOG; grep -E "^\| |budget|^rc|Error" /tmp/gt.log | tail -6
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py \
  tests/test_optimized_model.py > /tmp/t.log 2>&1
echo "pytest rc $?" >> /tmp/t.log; cat /tmp/t.log >> $LOG; tail -4 /tmp/t.log
