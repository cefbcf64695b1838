# eighteenth session, run 18: Nsight Compute on the library's B = 64 commit (N = 64, tf32, [128, 64] tiles capped
# at 128 registers, 4 programs per SM) and the B = 1 one, as bench/gdn_profile_run.sh does for every kernel
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache
timeout 200 ncu --clock-control none -k regex:_gdn_tree_commit --launch-count 4 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters \
  -f -o "$OUT/commit" python3 bench/gdn_profile.py --ncu > "$OUT/ncu_commit.log" 2>&1
tail -3 "$OUT/ncu_commit.log"
ncu -i "$OUT/commit.ncu-rep" --page details --csv > "$OUT/details.csv" 2>&1
ncu -i "$OUT/commit.ncu-rep" --page raw --csv > "$OUT/raw.csv" 2>&1
ncu -i "$OUT/commit.ncu-rep" --page source --csv --print-source sass -k "regex:commit" --launch-count 1 \
  > "$OUT/src_commit.csv" 2>&1 || true
python3 bench/ncu_summary.py "$OUT/details.csv" "$OUT/raw.csv" "$OUT/src_commit.csv" | tee "$OUT/summary.txt" | head -80
