# Run 93 (prepared in the thirty-second session for the next one): the library's fused verify
# (optimized/gdn_tree_fused.py, ported from gluon_probe's FOLD 28, never run on a GPU before) and the deferred
# commits (optimized/gdn_tree_pending.py): their GPU tests, then bench/gdn_fused.py (the fused step = verify_fused
# + record against the split tf32 verify + commit and fla-core 0.6.0's decode step, B = 64 / 32 / 8), then run 92
# (the record probe and FOLD 34)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run93.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gdn_fused.py tests/test_gdn_pending.py \
  >> $LOG 2>&1
echo "gpu tests rc $?" >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 200 python3 bench/gdn_fused.py --batches 64 32 8 \
  --out $OUT/gdn_fused_run93.json >> $LOG 2>&1
echo "gdn_fused rc $?" >> $LOG
OUT=$OUT timeout 180 bash bench/results/2026-12-03g/run92.sh > /dev/null 2>&1
echo "run92 rc $?" >> $LOG
grep -E '^\||passed|failed|Error|error| rc ' $LOG | tail -40
