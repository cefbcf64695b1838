# eighteenth session, run 16: the commit streaming its tile in chunks (KernelConfig.chunk_rows) against HEAD's
# whole-tile kernel (chunked_commit.diff reversed on a copy) at B = 64 / 16 / 1 (ab15c.py); decide16.py writes the
# winner at B = 64 into this copy's commit_config; then the benchmark (fp32, tf32, random trees, fla-core 0.6.0 in
# the same run) and the GPU tests of the GDN kernels on those configs
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
LOG=$OUT/logs_run16.txt
D=bench/results/2026-12-02g
cp optimized/gdn_tree.py /tmp/old_gdn_tree.py && patch -s -R /tmp/old_gdn_tree.py < $D/chunked_commit.diff \
  && echo "old kernel restored" >> $LOG
for B in 64 16 1; do
  timeout 80 python3 $D/ab15c.py $B /tmp/old_gdn_tree.py > /tmp/a_$B.log 2>&1
  echo "ab15c.py $B rc $?" >> /tmp/a_$B.log; cat /tmp/a_$B.log >> $LOG; grep -E "^\||rc |Error|diff" /tmp/a_$B.log | tail -22
done
python3 $D/decide16.py /tmp/a_64.log /tmp/a_16.log 2>&1 | tee -a $LOG
grep -q "chosen: commit default" $LOG && [ -n "$SKIP_TESTS" ] && exit 0  # nothing new to benchmark
timeout 190 python3 bench/gdn_tree.py --quick --modes tf32 --kinds random --fla-shapes 2 \
  --fla-budget-s 90 --budget-s 70 --out $OUT/gdn_tree_run16.json > /tmp/gt.log 2>&1
echo "rc $?" >> /tmp/gt.log
cat /tmp/gt.log >> $LOG; grep -E "^\| |budget|^rc|Error" /tmp/gt.log | tail -8
[ -n "$SKIP_TESTS" ] || timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py > /tmp/t.log 2>&1
echo "pytest rc $?" >> /tmp/t.log; cat /tmp/t.log >> $LOG; tail -4 /tmp/t.log
