# Thirty-first session, run 84: real-lg-half-prefetch-fnorm (FOLD 24: run 83's prefetch-norm with the consumer's
# column factors Gamma rk / scale Gamma rq handed over whole, so the consumer does no more work than without
# norms) at 184 / 192 solver registers, beside prefetch-norm (23) and prefetch (21), untraced; the Triton stand-in
# and fla-core 0.6.0's decode step, B = N = 64
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run84.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 300 python3 bench/results/2026-12-03g/gluon_probe.py \
  --variants "16,3,24,8,184,4;16,3,24,8,192,4;16,3,23,8,184,4;16,3,21,8,184,4" \
  --out $OUT/gluon_probe_run84.json >> $LOG 2>&1
echo "gluon_probe rc $?" >> $LOG
grep -E '^\||^check|^trace|rc |copy|random trees|Error|error' $LOG | tail -40
