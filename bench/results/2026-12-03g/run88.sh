# Run 88: run 87 showed the norm partition's misses as rows of o scaled by 1-4 % (a q norm summed over one wrong
# chunk of the same row): the SASS issues the last q loads before the partition barrier and the slot's free, their
# values used after it, and nothing orders those reads (generic proxy) before the refill's TMA write (async proxy).
# The norm partition now fences (fence.proxy.async) before each free. 27 (was 2.9-3.4e-3) and 28 re-run with it;
# 29: 28 with each chunk's products issued before its write-back (at 192 / 200 solver registers); 26 (no norms).
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run88.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 300 python3 bench/results/2026-12-03g/gluon_probe.py --trace \
  --variants "16,3,29,8,192,4;16,3,29,8,200,4;16,3,28,8,192,4;16,3,27,8,192,4;16,3,26,8,184,4" \
  --out $OUT/gluon_probe_run88.json >> $LOG 2>&1
echo "gluon_probe rc $?" >> $LOG
grep -E '^\||^check|^trace|rc |copy|random trees|Error|error' $LOG | tail -40
