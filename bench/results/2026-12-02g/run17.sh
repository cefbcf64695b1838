# eighteenth session, run 17: two latency changes (the commit's path words read for every row with the accepted
# node, the one-wave apply's QKD loaded with TB) against HEAD's kernels (tail_latency.diff reversed on a copy) at
# B = 1 / 64 (ab15c.py B old latency); then the benchmark (fp32, tf32, random trees, fla-core 0.6.0 in the
# same run) and the GPU tests of the GDN kernels, on the library with both changes; B = 16 last
# (as run, tail_latency.diff held only gdn_tree.py's hunks; it now also holds tree_attention.py's: to restore
# both, `git apply` it from the repository root)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
LOG=$OUT/logs_run17.txt
D=bench/results/2026-12-02g
cp optimized/gdn_tree.py /tmp/old_gdn_tree.py && patch -s -R /tmp/old_gdn_tree.py < $D/tail_latency.diff \
  && echo "old kernels restored" >> $LOG
for B in 1 64; do
  timeout 70 python3 $D/ab15c.py $B /tmp/old_gdn_tree.py latency > /tmp/a_$B.log 2>&1
  echo "ab15c.py $B latency rc $?" >> /tmp/a_$B.log; cat /tmp/a_$B.log >> $LOG; grep -E "^\||rc |Error|diff" /tmp/a_$B.log | tail -9
done
timeout 190 python3 bench/gdn_tree.py --quick --modes tf32 --kinds random --fla-shapes 2 \
  --fla-budget-s 90 --budget-s 70 --out $OUT/gdn_tree_run17.json > /tmp/gt.log 2>&1
echo "rc $?" >> /tmp/gt.log
cat /tmp/gt.log >> $LOG; grep -E "^\| |budget|^rc|Error" /tmp/gt.log | tail -8
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py \
  > /tmp/t.log 2>&1
echo "pytest rc $?" >> /tmp/t.log; cat /tmp/t.log >> $LOG; tail -4 /tmp/t.log
B=16; timeout 60 python3 $D/ab15c.py $B /tmp/old_gdn_tree.py latency > /tmp/a_$B.log 2>&1
echo "ab15c.py $B latency rc $?" >> /tmp/a_$B.log; cat /tmp/a_$B.log >> $LOG; grep -E "^\||rc |Error" /tmp/a_$B.log | tail -6
