# Thirtieth session, run 75: the ahead stage at 176 / 184 / 192 solver registers (184 three times), with 5 and
# 6 doublings, with a previous path of 32 nodes instead of 16, the smem-chain form at 176 / 184, beside the commit
# stage (16- and 32-node paths), the full stage, the Triton stand-in and fla-core 0.6.0's decode step, B = N = 64
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run75.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 420 python3 bench/results/2026-12-03g/gluon_probe.py \
  --out $OUT/gluon_probe_run75.json >> $LOG 2>&1
echo "gluon_probe rc $?" >> $LOG
grep -E '^\||^check|rc |copy' $LOG | tail -45
