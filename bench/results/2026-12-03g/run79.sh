# Thirty-first session, run 79: real-lg (FOLD 10: log2 Gamma prepared per request by _log2_gamma_kernel, timed
# with the kernel; scale in the exponent; no masked row sum, layout conversion or Gamma store in the solve),
# real-norm (12: q / k L2-normalised in the kernel), real-lean (13: 10 with fewer live tiles in the solve) and
# real-lean-norm (14), beside real and ahead-smem, each followed by one traced launch (--trace: cycles of each
# phase of the solve and consumer partitions), the Triton stand-in and fla-core 0.6.0's decode step, B = N = 64
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run79.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 300 python3 bench/results/2026-12-03g/gluon_probe.py --trace \
  --variants "16,3,13,8,184,4;16,3,13,8,176,4;16,3,13,8,192,4;16,3,14,8,184,4;16,3,10,8,184,4;16,3,12,8,184,4;16,3,8,8,184,4;16,3,7,8,184" \
  --out $OUT/gluon_probe_run79.json >> $LOG 2>&1
echo "gluon_probe rc $?" >> $LOG
grep -E '^\||^check|^trace|rc |copy|random trees|Error|error' $LOG | tail -40
