# Run 113: the library with the doubling's last square used, its operands fp16 up to depth 10 (tf32 past it) and
# Delta stored in fp16: forms of it (verify_ab.py: f16only, the solve at 176 / 192 registers), bench/gdn_fused.py
# at B = 64 / 32 / 16 / 8 / 1, the GPU tests (fused, pending, the split kernels)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run113.txt
timeout 200 python3 bench/results/2026-12-04/verify_ab.py $OUT/verify_ab_run113.json \
  "lib,f16only,r176,r192,lib" >> $LOG 2>&1
echo "verify_ab rc $?" >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 150 python3 bench/gdn_fused.py --batches 64 32 16 8 1 \
  --out $OUT/gdn_fused_run113.json >> $LOG 2>&1
echo "gdn_fused rc $?" >> $LOG
timeout 220 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gdn_fused.py tests/test_gdn_pending.py \
  tests/test_gdn_kernels.py >> $LOG 2>&1
echo "gpu tests rc $?" >> $LOG
grep -E '^\||passed|failed|^E  |rc |Error| us ' $LOG | grep -v "^E .*tensor(" | tail -40
