# seventeenth session, run 13: when the apply lets the commit launch (start / after its K loop / never) with 32- and
# 64-column apply blocks at B = 64 and 16; the apply at 16 columns, 64-row K chunks and commit tilings at B = 1; the
# q / k hand-off (KernelConfig.qk_handoff) at all three (ab13.py). Then decide13.py writes the winners into this
# copy's configs and the benchmark runs with them (fp32, tf32, random trees, fla-core 0.6.0 in the same run).
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
LOG=$OUT/logs_run13.txt
D=bench/results/2026-12-02f
for args in "64 large" "16 large" "1 small"; do
  timeout 90 python3 $D/ab13.py $args > /tmp/a_${args% *}.log 2>&1
  echo "ab13.py $args rc $?" >> /tmp/a_${args% *}.log; cat /tmp/a_${args% *}.log >> $LOG
  grep -E "^\||rc |Error" /tmp/a_${args% *}.log | tail -20
done
python3 $D/decide13.py /tmp/a_64.log /tmp/a_16.log /tmp/a_1.log 2>&1 | tee -a $LOG
# (the device copy's git HEAD is not the working commit: the diff this wrote showed the whole session's changes,
# not decide13.py's edits, which were none in run 13; it was dropped from the results)
git diff optimized/gdn_tree.py > $OUT/run13_configs.diff
timeout 200 python3 bench/gdn_tree.py --quick --modes tf32 --kinds random --fla-shapes 2 \
  --fla-budget-s 90 --budget-s 70 --out $OUT/gdn_tree_run13.json > /tmp/gt.log 2>&1
echo "rc $?" >> /tmp/gt.log
cat /tmp/gt.log >> $LOG; grep -E "^\| |budget|^rc|Error" /tmp/gt.log | tail -8
# the GPU tests of the file whose kernels and configs changed, on the configs chosen above
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py > /tmp/t.log 2>&1
echo "pytest rc $?" >> /tmp/t.log; cat /tmp/t.log >> $LOG; tail -4 /tmp/t.log
