# Thirtieth session, run 73: the ahead stage (the solve in a 4-warp partition one item ahead of the commit
# stream, handing TB / QKD over through two shared tiles: the fused kernel's data flow) and the overlap stage
# (the solve beside the stream, not handed over), with the doubling cut (L = 2) or off (L = 1) and at other solver
# register budgets, beside the fused / commit / full stages, the Triton stand-in and fla-core 0.6.0's decode step,
# B = 64, N = 64
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run73.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 150 python3 bench/results/2026-12-03g/gluon_probe.py --smoke --out /tmp/smoke.json >> $LOG 2>&1
rc=$?; echo "smoke rc $rc" >> $LOG
if [ $rc -eq 124 ]; then tail -30 $LOG; exit 1; fi
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 420 python3 bench/results/2026-12-03g/gluon_probe.py \
  --out $OUT/gluon_probe_run73.json >> $LOG 2>&1
echo "gluon_probe rc $?" >> $LOG
tail -50 $LOG
