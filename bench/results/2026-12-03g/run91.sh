# Run 91: run 90's global-memory norms were slower (207.0 / 209.2 us; 28 190.9). 33: 28 with the loader and the
# norm partition at 32 / 40 registers (compile-only: the consumer keeps 136, the solve at 200 spills 1 store
# against 28's 3 at 192), at 200 / 192 solver registers, beside 28 at 192.
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run91.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 300 python3 bench/results/2026-12-03g/gluon_probe.py --trace \
  --variants "16,3,33,8,200,4;16,3,33,8,192,4;16,3,28,8,192,4;16,3,28,8,200,4" \
  --out $OUT/gluon_probe_run91.json >> $LOG 2>&1
echo "gluon_probe rc $?" >> $LOG
grep -E '^\||^check|^trace|rc |copy|random trees|Error|error' $LOG | tail -40
