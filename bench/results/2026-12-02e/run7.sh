# sixteenth session, run 7: compute-sanitizer memcheck (1) on every eager launch form without the caching allocator
# (memcheck.py), (2) on the faulting case itself, ab.py at B = 16 with all graphs alive.
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run7.txt
D=bench/results/2026-12-02e
MC="compute-sanitizer --tool memcheck --print-limit 12 --show-backtrace no"
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 280 $MC python3 $D/memcheck.py > /tmp/m.log 2>&1
echo "memcheck.py rc $?" >> /tmp/m.log; cat /tmp/m.log >> $LOG
grep -E "Invalid|at |Address|ERROR SUMMARY|rc |Error|done" /tmp/m.log | head -40; tail -3 /tmp/m.log
timeout 250 $MC python3 $D/ab.py 16 > /tmp/a.log 2>&1
echo "ab.py 16 under memcheck rc $?" >> /tmp/a.log; cat /tmp/a.log >> $LOG
grep -E "Invalid|at |Address|ERROR SUMMARY|rc |Error" /tmp/a.log | head -40; tail -3 /tmp/a.log
