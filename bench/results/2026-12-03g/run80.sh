# Thirty-first session, run 80: real-lg-half (FOLD 15: real-lg with TB / QKD handed over in fp16, the epilogue's
# products in fp16 with fp32 accumulation, O stored by TMA from a staging tile), real-lg-half-3 / -4 (16 / 17: the
# solver's own q / k ring at 3 / 4 slots), beside real-lg and ahead-smem, each followed by one traced launch
# (--trace: per-phase cycles, and the consumer's chunk-loop sums), the Triton stand-in and fla-core 0.6.0's decode
# step, B = N = 64
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run80.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 300 python3 bench/results/2026-12-03g/gluon_probe.py --trace \
  --variants "16,3,15,8,184,4;16,3,15,8,176,4;16,3,16,8,184,4;16,3,16,8,176,4;16,3,17,8,184,4;16,3,10,8,184,4;16,3,7,8,184" \
  --out $OUT/gluon_probe_run80.json >> $LOG 2>&1
echo "gluon_probe rc $?" >> $LOG
grep -E '^\||^check|^trace|rc |copy|random trees|Error|error' $LOG | tail -40
