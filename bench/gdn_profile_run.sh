#!/usr/bin/env bash
# One device call: per-kernel times of the GDN tree verify (bench/gdn_profile.py), then Nsight Compute on one launch
# of each kernel (speed of light, occupancy, launch stats, warp states, memory, source-level stall sampling).
# Writes under $OUT: profile.{json,log}, ncu.log, prof.ncu-rep, details.csv, raw.csv, src_*.csv.
set -u
: "${OUT:?set OUT to the output folder}"
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache
python3 bench/gdn_profile.py --out "$OUT/profile.json" 2>&1 | tee "$OUT/profile.log"
timeout 300 ncu --clock-control none -k regex:_gdn_tree --launch-count 12 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section SourceCounters \
  -f -o "$OUT/prof" python3 bench/gdn_profile.py --ncu > "$OUT/ncu.log" 2>&1
tail -5 "$OUT/ncu.log"
ncu -i "$OUT/prof.ncu-rep" --page details --csv > "$OUT/details.csv" 2>&1
ncu -i "$OUT/prof.ncu-rep" --page raw --csv > "$OUT/raw.csv" 2>&1
for k in solve apply verify_kernel commit; do
  ncu -i "$OUT/prof.ncu-rep" --page source --csv --print-source sass -k "regex:$k" --launch-count 1 \
    > "$OUT/src_$k.csv" 2>&1 || true
done
python3 bench/ncu_summary.py "$OUT/details.csv" "$OUT/raw.csv" "$OUT"/src_*.csv
