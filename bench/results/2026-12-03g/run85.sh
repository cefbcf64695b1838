# Prepared in the thirty-first session, not run (its device time was spent): run 85: real-lg-half-prefetch-wnorm
# (FOLD 25: q / k norms summed by a 1-warp partition reading the solve's q / k ring, so the norms leave the solve)
# at 184 / 176 solver registers, real-lg-half-prefetch-kpt (26: the path operand (diag(w) K_p)^T prepared per item
# and loaded by TMA), beside prefetch-norm (23: the norms in the solve, 216.0 us in run 84) and prefetch (21: no
# norms, 181.8 us); the Triton stand-in and fla-core 0.6.0's decode step, B = N = 64
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run85.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 300 python3 bench/results/2026-12-03g/gluon_probe.py \
  --variants "16,3,25,8,184,4;16,3,25,8,176,4;16,3,26,8,184,4;16,3,23,8,184,4;16,3,21,8,184,4" \
  --out $OUT/gluon_probe_run85.json >> $LOG 2>&1
echo "gluon_probe rc $?" >> $LOG
grep -E '^\||^check|^trace|rc |copy|random trees|Error|error' $LOG | tail -40
