# Run 115: the committed library once more: bench/gdn_fused.py at B = 64 / 32 / 16 / 8 / 1 (a second sample of run
# 114's table), then every GPU test (`pytest -m gpu tests/`, within the call's time)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run115.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 150 python3 bench/gdn_fused.py --batches 64 32 16 8 1 \
  --out $OUT/gdn_fused_run115.json >> $LOG 2>&1
echo "gdn_fused rc $?" >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 380 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ >> $LOG 2>&1
echo "gpu tests rc $?" >> $LOG
grep -E '^\||passed|failed|^FAILED|^E  |rc |Error' $LOG | grep -v "^E .*tensor(" | tail -40
