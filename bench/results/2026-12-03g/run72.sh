# Thirtieth session, run 72: the Gluon commit stage with the solve in a partition of its own beside it (overlap), the fused and commit stages, against the Triton
# stand-in's same stages and fla-core 0.6.0's decode step, B = 64, N = 64
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run72.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
python3 -c "import triton; print('triton', triton.__version__)" >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 150 python3 bench/results/2026-12-03g/gluon_probe.py --smoke --out /tmp/smoke.json >> $LOG 2>&1
rc=$?; echo "smoke rc $rc" >> $LOG
if [ $rc -eq 124 ]; then tail -30 $LOG; exit 1; fi
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 420 python3 bench/results/2026-12-03g/gluon_probe.py \
  --out $OUT/gluon_probe_run72.json >> $LOG 2>&1
echo "gluon_probe rc $?" >> $LOG
tail -60 $LOG
