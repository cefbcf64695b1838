# Thirty-first session, run 78: real-rows (FOLD 9: each row's bitset words loaded once, the item's words, gates
# and beta loaded before its Gram products) at 184 / 176 solver registers, beside real (run 77's 219.2 us) and
# ahead-smem, the Triton stand-in and fla-core 0.6.0's decode step, B = N = 64; checked against the library's
# float64 closed form on the committed state
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run78.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 240 python3 bench/results/2026-12-03g/gluon_probe.py \
  --variants "16,3,9,8,184,4;16,3,9,8,176,4;16,3,8,8,184,4;16,3,7,8,184" --out $OUT/gluon_probe_run78.json >> $LOG 2>&1
echo "gluon_probe rc $?" >> $LOG
grep -E '^\||^check|rc |copy|random trees|Error|error' $LOG | tail -30
