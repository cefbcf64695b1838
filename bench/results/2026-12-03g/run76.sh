# Thirtieth session, run 76: the ahead stage with the doubling's operands in shared memory (ahead-smem) at 5 and 6
# doublings, 176 / 184 solver registers (run 75: the register-conversion form lost 21 / 30 µs at 5 / 6), beside
# the ahead form at 4, the Triton stand-in and fla-core 0.6.0's decode step, B = N = 64
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run76.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 300 python3 bench/results/2026-12-03g/gluon_probe.py \
  --variants "16,3,7,8,184,5;16,3,7,8,184,6;16,3,7,8,176,5;16,3,7,8,176,6;16,3,6,8,184;16,3,7,8,184" --out $OUT/gluon_probe_run76.json >> $LOG 2>&1
echo "gluon_probe rc $?" >> $LOG
grep -E '^\||^check|rc |copy' $LOG | tail -30
