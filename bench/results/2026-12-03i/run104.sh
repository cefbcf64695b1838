# Run 104: GPU tests of the new kernel (the doubling's products a round together, the vector partition, the record's
# early path load); kernel_ab.py (head / doubling / library, solve register budgets, record warps); bench/gdn_fused.py
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run104.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gdn_fused.py tests/test_gdn_pending.py \
  >> $LOG 2>&1
echo "gpu tests rc $?" >> $LOG
timeout 200 python3 bench/results/2026-12-03i/kernel_ab.py $OUT/kernel_ab_run104.json >> $LOG 2>&1
echo "kernel_ab rc $?" >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 200 python3 bench/gdn_fused.py --batches 64 32 16 8 1 \
  --out $OUT/gdn_fused_run104.json >> $LOG 2>&1
echo "gdn_fused rc $?" >> $LOG
grep -E '^\||passed|failed|^E  |verify |record alone|rc |Error' $LOG | grep -v "^E .*tensor(" | tail -40
