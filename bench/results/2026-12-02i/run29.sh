# Twentieth session, run 29: the benchmark in every precision mode again, with the ieee split solve's doubling back
# in the squaring-first form (the overlapped form, in the split solve since the fourteenth session, compiles in ieee
# mode to 32 registers and 7.8 KB of stack: run 28 measured B = 64 ieee at 5141.5 us against 1396.9 in the
# thirteenth session) and the fused kernel's gates-first load order (run 26); then the GPU tests of the GDN kernels
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
LOG=$OUT/logs_run29.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
timeout 330 python3 bench/gdn_tree.py --quick --modes tf32 tf32x3 ieee --kinds random --fla-shapes 2 \
  --fla-budget-s 90 --budget-s 200 --out $OUT/gdn_tree_run29.json > /tmp/gt.log 2>&1
echo "rc $?" >> /tmp/gt.log
cat /tmp/gt.log >> $LOG; grep -E "^\| |budget|^rc|Error" /tmp/gt.log | tail -8
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py > /tmp/t.log 2>&1
echo "pytest rc $?" >> /tmp/t.log; cat /tmp/t.log >> $LOG; tail -3 /tmp/t.log
