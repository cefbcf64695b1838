# Twentieth session, run 32: the final benchmark in every precision mode (fp32 inputs, random trees, B = 64 and 1,
# N = 64, fla-core 0.6.0 in the same run): the library with this session's changes (ieee: the split solve's doubling
# squaring-first and the large-batch commit rank-one; the fused kernel's gates-first load order)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
LOG=$OUT/logs_run32.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
timeout 330 python3 bench/gdn_tree.py --quick --modes tf32 tf32x3 ieee --kinds random --fla-shapes 2 \
  --fla-budget-s 90 --budget-s 200 --out $OUT/gdn_tree_run32.json > /tmp/gt.log 2>&1
echo "rc $?" >> /tmp/gt.log
cat /tmp/gt.log >> $LOG; grep -E "^\| |budget|^rc|Error" /tmp/gt.log | tail -8
