# Thirtieth session, run 74: the ahead stage with every doubling product's operands in shared memory (ahead-smem,
# no register layout conversions) against run 73's form, at 152-200 solver registers, beside the commit / fused /
# full stages, the Triton stand-in and fla-core 0.6.0's decode step, B = 64, N = 64
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run74.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 150 python3 bench/results/2026-12-03g/gluon_probe.py --smoke --out /tmp/smoke.json >> $LOG 2>&1
rc=$?; echo "smoke rc $rc" >> $LOG
if [ $rc -eq 124 ]; then tail -30 $LOG; exit 1; fi
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 420 python3 bench/results/2026-12-03g/gluon_probe.py \
  --out $OUT/gluon_probe_run74.json >> $LOG 2>&1
echo "gluon_probe rc $?" >> $LOG
tail -50 $LOG
