# Run 107: the library as committed (doubling rounds, vector partition, SOLVER_REGS 184, the record's early path
# load): GPU tests (fused, pending, the split kernels), bench/gdn_fused.py at B = 64 / 32 / 16 / 8 / 1
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run107.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 150 python3 bench/gdn_fused.py --batches 64 32 16 8 1 \
  --out $OUT/gdn_fused_run107.json >> $LOG 2>&1
echo "gdn_fused rc $?" >> $LOG
timeout 290 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gdn_fused.py tests/test_gdn_pending.py \
  tests/test_gdn_kernels.py >> $LOG 2>&1
echo "gpu tests rc $?" >> $LOG
grep -E '^\||passed|failed|^E  |rc |Error' $LOG | grep -v "^E .*tensor(" | tail -24
