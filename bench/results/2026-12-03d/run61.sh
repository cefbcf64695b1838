# Twenty-sixth session, run 61: probe61.py's six forms of run 60's fault (row_halves.patch applied), then the failing
# form under compute-sanitizer (the faulting kernel, the instruction and the address)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run61.txt
timeout 400 python3 bench/results/2026-12-03c/probe61.py >> $LOG 2>&1
echo "probe rc $?" >> $LOG
PROBE_SCRIPT=/tmp/case0.py python3 bench/results/2026-12-03c/probe61.py
CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
echo "sanitizer: $CS" >> $LOG
if [ -n "$CS" ]; then
  timeout 150 $CS --tool memcheck --print-limit 4 python3 /tmp/case0.py >> $LOG 2>&1
  echo "sanitizer rc $?" >> $LOG
fi
tail -c 9000 $LOG
