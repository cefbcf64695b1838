# Run 90: the norm partition reading q / k from global memory by plain loads (FOLD 32: it runs ahead of the
# solve, bounded by nvec's two buffers, and no ring slot waits for it; q / k read once more, from L2 mostly) at
# 192 / 200 solver registers (compile-only: the solve spills 28 / 3 stores, the consumer 4 / 10), beside 28.
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run90.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 300 python3 bench/results/2026-12-03g/gluon_probe.py --trace \
  --variants "16,3,32,8,192,4;16,3,32,8,200,4;16,3,28,8,192,4" \
  --out $OUT/gluon_probe_run90.json >> $LOG 2>&1
echo "gluon_probe rc $?" >> $LOG
grep -E '^\||^check|^trace|rc |copy|random trees|Error|error' $LOG | tail -40
