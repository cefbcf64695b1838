# Run 102: GPU tests (the first GPU run of the shared add_path_terms loop), then the library's fused verify with its
# doubling unrolled and guarded, and with lean solve masks (data_probe.py)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run102.txt
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gdn_fused.py tests/test_gdn_pending.py \
  tests/test_gdn_kernels.py >> $LOG 2>&1
echo "gpu tests rc $?" >> $LOG
timeout 200 python3 bench/results/2026-12-03h/data_probe.py $OUT/data_probe_run102.json \
  "unrolled guarded doubling" "lean solve masks" "unrolled doubling, lean masks" >> $LOG 2>&1
echo "data_probe rc $?" >> $LOG
grep -E 'passed|failed|^E  |verify |rc |Error' $LOG | grep -v "^E .*tensor(" | tail -14
