# fourteenth session, run 4: B = 1 split-pipeline forms (apply width and stages, solve stages and K chunk) against the
# fused kernel at B = 1, 4, 8 and N = 32, 64, 128 (fp32) and bf16; timelines of both (GPU tests after the config change).
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
LOG=$OUT/logs_run4.txt
timeout 420 python3 bench/results/2026-12-02c/b1_probe.py --out $OUT/b1_run4.json > /tmp/b1.log 2>&1
echo "rc $?" >> /tmp/b1.log
cat /tmp/b1.log >> $LOG; grep -vE "^\s*$" /tmp/b1.log | grep -v "built and checked" | tail -100
