# Run 102: the library's fused verify with its doubling unrolled and guarded, and with lean solve masks (data_probe.py)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run102.txt
timeout 200 python3 bench/results/2026-12-03h/data_probe.py $OUT/data_probe_run102.json \
  "unrolled guarded doubling" "lean solve masks" "unrolled doubling, lean masks" >> $LOG 2>&1
echo "data_probe rc $?" >> $LOG
grep -E 'verify |rc |Error' $LOG | tail -8
