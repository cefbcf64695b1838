# prepared for the next session (not run: no device time left): (1) ab.py at B = 16 with all variants' graphs
# alive, as run 4 faulted; (2) the benchmark at B = 64 and 1; (3) the GPU tests. Between (1) and (2): fp16 scratch
# with the apply capped at 128 registers at B = 64 and 16 (ab.py ... serial cap).
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
LOG=$OUT/logs_run6.txt
timeout 90 python3 bench/results/2026-12-02d/ab.py 16 > /tmp/a.log 2>&1
echo "B 16 all graphs rc $?" >> /tmp/a.log; cat /tmp/a.log >> $LOG; grep -E "^\||rc |Error" /tmp/a.log | tail -8
for b in 64 16; do  # fp16 scratch with the apply at 128 registers (4 programs per SM, as fp32 scratch)
  timeout 90 python3 bench/results/2026-12-02d/ab.py $b serial cap > /tmp/a.log 2>&1
  echo "B $b cap rc $?" >> /tmp/a.log; cat /tmp/a.log >> $LOG; grep -E "^\||rc |Error" /tmp/a.log | tail -8
done
timeout 250 python3 bench/gdn_tree.py --quick --modes tf32 --kinds random --fla-shapes 2 \
  --fla-budget-s 100 --budget-s 80 --out $OUT/gdn_tree_run6.json > /tmp/gt.log 2>&1
echo "rc $?" >> /tmp/gt.log
cat /tmp/gt.log >> $LOG; grep -E "^\| |budget|^rc|Error" /tmp/gt.log | tail -6
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py tests/test_conv_kernels.py \
  tests/test_optimized_model.py > /tmp/t.log 2>&1
echo "pytest rc $?" >> /tmp/t.log; cat /tmp/t.log >> $LOG; tail -4 /tmp/t.log
