# Run 110 (prepared, not run): the record kernel of the B = 64 step under Nsight Compute (record_profile.py: 2 warps
# uncapped, then 4 warps at 64 registers; the last two launches of each profiled)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 bench/results/2026-12-03i/record_profile.py > $OUT/warm.log 2>&1  # compile outside the profiler
timeout 300 ncu --clock-control none -k regex:_record_kernel --launch-skip 2 --launch-count 6 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section SchedulerStats --section MemoryWorkloadAnalysis --section SourceCounters \
  -f -o "$OUT/prof" python3 bench/results/2026-12-03i/record_profile.py > "$OUT/ncu.log" 2>&1
tail -3 "$OUT/ncu.log"
ncu -i "$OUT/prof.ncu-rep" --page details --csv > "$OUT/details.csv" 2>&1
ncu -i "$OUT/prof.ncu-rep" --page raw --csv > "$OUT/raw.csv" 2>&1
ncu -i "$OUT/prof.ncu-rep" --page source --csv --print-source sass -k regex:_record_kernel --launch-count 1 \
  > "$OUT/src_record.csv" 2>&1 || true
python3 bench/ncu_summary.py "$OUT/details.csv" "$OUT/raw.csv" "$OUT/src_record.csv"
