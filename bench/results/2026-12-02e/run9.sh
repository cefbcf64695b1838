# sixteenth session, run 9: fp32 against bf16 inputs at B = 64 (l2probe.py), then Nsight Compute on the split
# pipeline's kernels at B = 64 (throughputs: is the apply bound by its L2 traffic?)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run9.txt
D=bench/results/2026-12-02e
timeout 100 python3 $D/l2probe.py > /tmp/a.log 2>&1
echo "l2probe rc $?" >> /tmp/a.log; cat /tmp/a.log >> $LOG; grep -E "^\||rc |Error|err" /tmp/a.log | tail -9
timeout 150 ncu --clock-control none -k regex:"_gdn_tree_(apply|solve|commit)" --launch-skip 2 --launch-count 2 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \
  -f -o /tmp/prof python3 $D/l2probe.py --ncu > /tmp/ncu.log 2>&1
echo "ncu rc $?" >> /tmp/ncu.log; tail -3 /tmp/ncu.log; cat /tmp/ncu.log >> $LOG
ncu -i /tmp/prof.ncu-rep --page details > $OUT/ncu_details_run9.txt 2>&1
grep -E "_gdn_tree|Throughput|Hit Rate|Duration|Achieved Occupancy|Registers Per|Bandwidth|Busy" \
  $OUT/ncu_details_run9.txt | head -60
