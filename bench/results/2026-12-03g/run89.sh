# Run 89: run 88 mended the norm partition (27: 8.75e-4, 28: 192.2 us with the fence) and found no gain in issuing
# the products before the write-back (29: 191.8 us; the consumer's path updates grew). 30: 28 with each updated
# chunk written back from registers by plain stores (no staging store, two barriers, fence, TMA store or store
# wait a chunk); 31: 26 (no norms) with that; beside 28 and 26.
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run89.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 300 python3 bench/results/2026-12-03g/gluon_probe.py --trace \
  --variants "16,3,30,8,192,4;16,3,31,8,184,4;16,3,28,8,192,4;16,3,26,8,184,4" \
  --out $OUT/gluon_probe_run89.json >> $LOG 2>&1
echo "gluon_probe rc $?" >> $LOG
grep -E '^\||^check|^trace|rc |copy|random trees|Error|error' $LOG | tail -40
