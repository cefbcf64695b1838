# Thirty-first session, run 81: real-lg-half-pipe (FOLD 18: real-lg-half with each chunk's path update issued
# beside the previous chunk's products, added in its accumulator layout, slots freed one chunk late) at 184 / 176
# solver registers, beside real-lg-half (15) and real-lg-half-3 (16) of run 80, 18 and 15 repeated, ahead-smem;
# each followed by one traced launch; the Triton stand-in and fla-core 0.6.0's decode step, B = N = 64
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run81.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 300 python3 bench/results/2026-12-03g/gluon_probe.py --trace \
  --variants "16,3,18,8,184,4;16,3,18,8,176,4;16,3,15,8,184,4;16,3,16,8,176,4;16,3,18,8,184,4;16,3,15,8,184,4;16,3,7,8,184" \
  --out $OUT/gluon_probe_run81.json >> $LOG 2>&1
echo "gluon_probe rc $?" >> $LOG
grep -E '^\||^check|^trace|rc |copy|random trees|Error|error' $LOG | tail -40
