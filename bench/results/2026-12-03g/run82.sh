# Thirty-first session, run 82: real-lg-half-prefetch (FOLD 21: the path weights loaded before the path wait, the
# next item's state row during this item), real-lg-half-ahead (19: the path update one chunk ahead, slots freed on
# time) and real-lg-half-norm (20: q / k L2-normalised in the kernel) beside real-lg-half (15, twice), 21 twice
# and at 176 registers, untraced; the Triton stand-in and fla-core 0.6.0's decode step, B = N = 64
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run82.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 300 python3 bench/results/2026-12-03g/gluon_probe.py \
  --variants "16,3,21,8,184,4;16,3,19,8,184,4;16,3,20,8,184,4;16,3,15,8,184,4;16,3,21,8,176,4;16,3,21,8,184,4;16,3,15,8,184,4" \
  --out $OUT/gluon_probe_run82.json >> $LOG 2>&1
echo "gluon_probe rc $?" >> $LOG
grep -E '^\||^check|^trace|rc |copy|random trees|Error|error' $LOG | tail -40
