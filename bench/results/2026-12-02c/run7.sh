# fourteenth session, run 7: two loads ahead of a wait (the apply's v before its wait, the solve's ancestor mask
# before its K loop) against the library's default, B = 1 and 64, N = 64 (probe, no timeline).
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
LOG=$OUT/logs_run7.txt
timeout 170 python3 bench/results/2026-12-02c/b1_probe.py --out $OUT/b1_run7.json --budget-s 110 > /tmp/b1.log 2>&1
echo "rc $?" >> /tmp/b1.log
cat /tmp/b1.log >> $LOG; grep -vE "^\s*$" /tmp/b1.log | grep -v "built and checked" | grep -v '^ ' | tail -40
