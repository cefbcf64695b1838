# eighth session, run 7: the tree conv epilogue of w_in alone (bench/treeconv_probe.py: GEMV, GEMV with the conv
# in its epilogue, GEMV + tree_conv kernel, N = 16 / 32 / 64), then Nsight Compute on the N = 64 GEMV with and
# without the epilogue (warp states, source-level stall sampling)
export PYTHONPATH=$PWD:$PWD/bench PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache
timeout 80 python3 bench/treeconv_probe.py --nodes 16 32 64 --out $OUT/treeconv_probe.json 2>&1 | tail -4
timeout 100 ncu --clock-control none -k regex:_gemv_kernel --launch-skip 2 --launch-count 2 \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SourceCounters \
  -f -o /tmp/prof python3 bench/treeconv_probe.py --ncu --nodes 64 > /tmp/ncu.log 2>&1
tail -3 /tmp/ncu.log
ncu -i /tmp/prof.ncu-rep --page details --csv > /tmp/details.csv 2>&1
ncu -i /tmp/prof.ncu-rep --page raw --csv > /tmp/raw.csv 2>&1
ncu -i /tmp/prof.ncu-rep --page source --csv --print-source sass -k regex:_gemv --launch-skip 1 --launch-count 1 \
  > /tmp/src_epilogue.csv 2>&1 || true
python3 bench/ncu_summary.py /tmp/details.csv /tmp/raw.csv /tmp/src_epilogue.csv > $OUT/ncu_summary.txt 2>&1
head -c 9000 $OUT/ncu_summary.txt
