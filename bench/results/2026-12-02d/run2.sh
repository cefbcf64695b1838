# fifteenth session, run 2: the B = 64 fault of run 1 isolated (crash64.py, one form per process), then the probe
# (mask before the K loop, gram split, fp16 scratch), one shape per process.
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
LOG=$OUT/logs_run2.txt
for form in pdl pdl32 plain verify reset; do
  timeout 60 python3 bench/results/2026-12-02d/crash64.py $form > /tmp/c.log 2>&1
  echo "crash64 $form rc $?" >> /tmp/c.log; cat /tmp/c.log >> $LOG; grep -E "replays|rc |Error" /tmp/c.log | tail -3
done
for i in 0 1 2 3; do
  timeout 100 python3 bench/results/2026-12-02d/probe.py --shape $i --out $OUT/probe_run2_$i.json > /tmp/p.log 2>&1
  echo "shape $i rc $?" >> /tmp/p.log
  cat /tmp/p.log >> $LOG; grep -vE "built and checked" /tmp/p.log | grep -E "^\||^B =|rc |Error" | tail -14
done
