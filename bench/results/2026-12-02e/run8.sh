# sixteenth session, run 8 (final): (1) ab.py at B = 16 with every variant's graphs alive, pools now kept alive
# (the harness fault found in run 7), fp16 scratch and the register caps (the new defaults) against the old ones;
# (2) the benchmark; (3) the GPU tests (GDN, conv, model files).
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
LOG=$OUT/logs_run8.txt
D=bench/results/2026-12-02e
timeout 100 python3 $D/ab.py 16 cap > /tmp/a.log 2>&1
echo "ab.py 16 cap rc $?" >> /tmp/a.log; cat /tmp/a.log >> $LOG; grep -E "^\||rc |Error" /tmp/a.log | tail -9
timeout 250 python3 bench/gdn_tree.py --quick --modes tf32 --kinds random --fla-shapes 2 \
  --fla-budget-s 100 --budget-s 80 --out $OUT/gdn_tree_run8.json > /tmp/gt.log 2>&1
echo "rc $?" >> /tmp/gt.log
cat /tmp/gt.log >> $LOG; grep -E "^\| |budget|^rc|Error" /tmp/gt.log | tail -6
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py tests/test_conv_kernels.py \
  tests/test_optimized_model.py > /tmp/t.log 2>&1
echo "pytest rc $?" >> /tmp/t.log; cat /tmp/t.log >> $LOG; tail -4 /tmp/t.log
