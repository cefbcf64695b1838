# Run 103: diagnostics of the library's fused verify (data_probe.py: builds with parts of the work removed, timed
# only), the step with the record fixed (bench/gdn_fused.py, B = 64), then the GPU tests (the record's fix and the
# shared add_path_terms loop on the GPU)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run103.txt
timeout 150 python3 bench/results/2026-12-03h/data_probe.py $OUT/data_probe_run103.json "diag: one doubling" \
  "diag: no row sum" "diag: no log_gamma store" "diag: no depth load" "diag: no row sum, store, depth" \
  "diag: no path update" "diag: no write-back" >> $LOG 2>&1
echo "data_probe rc $?" >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 100 python3 bench/gdn_fused.py --batches 64 \
  --out $OUT/gdn_fused_run103.json >> $LOG 2>&1
echo "gdn_fused rc $?" >> $LOG
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gdn_fused.py tests/test_gdn_pending.py \
  tests/test_gdn_kernels.py >> $LOG 2>&1
echo "gpu tests rc $?" >> $LOG
grep -E '^\||passed|failed|^E  |verify |rc |Error' $LOG | grep -v "^E .*tensor(" | tail -24
