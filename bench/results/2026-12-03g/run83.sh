# Thirty-first session, run 83: where in-kernel q / k norms cost (run 82: +33 us): real-lg-half-prefetch-norm
# (FOLD 23: fp32 squares of q and k), real-lg-half-gnorm (22: |k|^2 from K K^T's diagonal, q / k given on the tf32
# grid), real-lg-half-norm (20) and real-lg-half-prefetch (21), each followed by one traced launch; the Triton
# stand-in and fla-core 0.6.0's decode step, B = N = 64
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run83.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 300 python3 bench/results/2026-12-03g/gluon_probe.py --trace \
  --variants "16,3,23,8,184,4;16,3,22,8,184,4;16,3,20,8,184,4;16,3,21,8,184,4" \
  --out $OUT/gluon_probe_run83.json >> $LOG 2>&1
echo "gluon_probe rc $?" >> $LOG
grep -E '^\||^check|^trace|rc |copy|random trees|Error|error' $LOG | tail -40
