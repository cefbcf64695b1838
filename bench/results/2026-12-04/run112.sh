# Run 112: the doubling with its last square used (pow2), in fp16 (h16), Delta stored in fp16 (d16: timing
# only, its check fails), each alone and together; then bench/gdn_fused.py at B = 64
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run112.txt
timeout 330 python3 bench/results/2026-12-04/verify_ab.py $OUT/verify_ab_run112.json \
  "lib,pow2,h16,pow2+h16,d16,pow2+h16+d16,lib,pow2+h16" >> $LOG 2>&1
echo "verify_ab rc $?" >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 150 python3 bench/gdn_fused.py --batches 64 \
  --out $OUT/gdn_fused_run112.json >> $LOG 2>&1
echo "gdn_fused rc $?" >> $LOG
grep -vE "^\s*$" $LOG | grep -v "^E .*tensor(" | tail -30
