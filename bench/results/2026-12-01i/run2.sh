# ninth session, run 2: Nsight Compute on the N = 64 w_in GEMV with and without the tree conv epilogue (warp states,
# source-level stall sampling), then the A / B of the attention change alone (empty splits store nothing, the combine
# reads only the splits with keys) against the previous commit (ab/old)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache
LOG=$OUT/logs_run2.txt
ROOT=$PWD
export PYTHONPATH=$PWD:$PWD/bench
timeout 120 ncu --clock-control none -k regex:_gemv_kernel --launch-skip 2 --launch-count 2 \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SourceCounters \
  -f -o /tmp/prof python3 bench/treeconv_probe.py --ncu --nodes 64 > /tmp/ncu.log 2>&1
tail -3 /tmp/ncu.log
ncu -i /tmp/prof.ncu-rep --page details --csv > /tmp/details.csv 2>&1
ncu -i /tmp/prof.ncu-rep --page raw --csv > /tmp/raw.csv 2>&1
ncu -i /tmp/prof.ncu-rep --page source --csv --print-source sass -k regex:_gemv --launch-skip 1 --launch-count 1 \
  > /tmp/src_epilogue.csv 2>&1 || true
ncu -i /tmp/prof.ncu-rep --page source --csv --print-source cuda,sass -k regex:_gemv --launch-skip 1 --launch-count 1 \
  > $OUT/src_epilogue_cuda.csv 2>&1 || true
python3 bench/ncu_summary.py /tmp/details.csv /tmp/raw.csv /tmp/src_epilogue.csv > $OUT/ncu_summary.txt 2>&1
head -c 7000 $OUT/ncu_summary.txt
mv1() {  # tag dir B N extra...
  tag=$1; dir=$2; B=$3; N=$4; shift 4
  (cd $dir && PYTHONPATH=$PWD:$PWD/bench timeout 120 python3 bench/model_verify.py --B $B --L 1024 --N $N \
    --gdn-precisions tf32 "$@" --out /tmp/${tag}_B${B}_N${N}.json > /tmp/mv.log 2>&1)
  echo "== $tag B=$B N=$N $*" >> $LOG; cat /tmp/mv.log >> $LOG
  echo "$tag $(grep -E "^ +$B +1024" /tmp/mv.log | cut -c1-100)"
}
mv1 old $ROOT/ab/old 1 64
mv1 new $ROOT 1 64
mv1 old $ROOT/ab/old 1 32
mv1 new $ROOT 1 32
mv1 old $ROOT/ab/old 1 64
mv1 new $ROOT 1 64
