# Run 86: run 85's norm partition mended and widened: 2 warps (FOLD 27, at 184 / 192 solver registers) reading whole
# [N, BK] chunks, every lane's loads done (a partition barrier) before the slot's free; 27 with the prepared path
# operand (28); 26 re-run (run 85's host code unpacked the prepared path into the float64 check); 25 (1 warp),
# 23 (norms in the solve), 21 (no norms). The normalised stages' inputs now have rows of random norms (run 85's
# had one norm for every row, so a norm read from the wrong row could not show in the errors).
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run86.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 300 python3 bench/results/2026-12-03g/gluon_probe.py --trace \
  --variants "16,3,27,8,184,4;16,3,27,8,192,4;16,3,28,8,192,4;16,3,26,8,184,4;16,3,25,8,184,4;16,3,23,8,184,4;16,3,21,8,184,4" \
  --out $OUT/gluon_probe_run86.json >> $LOG 2>&1
echo "gluon_probe rc $?" >> $LOG
grep -E '^\||^check|^trace|rc |copy|random trees|Error|error' $LOG | tail -40
