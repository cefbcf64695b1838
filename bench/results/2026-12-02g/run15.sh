# eighteenth session, run 15: the 64-column apply capped at 128 registers (2 / 3 stages, the commit launched late /
# early) and the commit streaming its state tiles, at B = 64 / 32 / 16 (ab13.py B cap); decide15.py writes the
# winner at B = 64 into this copy's configs; then the benchmark (fp32, tf32, random trees, fla-core 0.6.0 in the
# same run) and the GPU tests of the GDN kernels on those configs
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
LOG=$OUT/logs_run15.txt
A=bench/results/2026-12-02f/ab13.py
D=bench/results/2026-12-02g
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader >> $LOG
for B in 64 32 16; do
  timeout 80 python3 $A $B cap > /tmp/a_$B.log 2>&1
  echo "ab13.py $B cap rc $?" >> /tmp/a_$B.log; cat /tmp/a_$B.log >> $LOG; grep -E "^\||rc |Error" /tmp/a_$B.log | tail -10
done
python3 $D/decide15.py /tmp/a_64.log 2>&1 | tee -a $LOG
timeout 200 python3 bench/gdn_tree.py --quick --modes tf32 --kinds random --fla-shapes 2 \
  --fla-budget-s 90 --budget-s 70 --out $OUT/gdn_tree_run15.json > /tmp/gt.log 2>&1
echo "rc $?" >> /tmp/gt.log
cat /tmp/gt.log >> $LOG; grep -E "^\| |budget|^rc|Error" /tmp/gt.log | tail -8
timeout 110 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py > /tmp/t.log 2>&1
echo "pytest rc $?" >> /tmp/t.log; cat /tmp/t.log >> $LOG; tail -4 /tmp/t.log
