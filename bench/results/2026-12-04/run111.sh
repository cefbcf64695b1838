# Run 111: forms of the fused verify (verify_ab.py: O through v's buffer, the solve's ring at 4 / 6 slots, the
# loader's at 4 stages) with the record at 4 warps and 64 registers (now the library's), then bench/gdn_fused.py
# at B = 64 / 32 (fla's decode step in the same run)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run111.txt
timeout 330 python3 bench/results/2026-12-04/verify_ab.py $OUT/verify_ab_run111.json \
  "lib,ov,ov+s4,ov+s6,ov+s4+st4,lib,ov+s4,ov+s6" >> $LOG 2>&1
echo "verify_ab rc $?" >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 150 python3 bench/gdn_fused.py --batches 64 32 \
  --out $OUT/gdn_fused_run111.json >> $LOG 2>&1
echo "gdn_fused rc $?" >> $LOG
grep -vE "^\s*$" $LOG | grep -v "^E .*tensor(" | tail -30
