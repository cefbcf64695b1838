# fourteenth session, run 1: B = 1 probe (split pipeline with the apply PDL launch, PDL commit, fused at 8 warps,
# timeline of the fused verify and the commit) and fla's decode step side by side.
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
LOG=$OUT/logs_run1.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv >> $LOG
timeout 420 python3 bench/results/2026-12-02c/b1_probe.py --out $OUT/b1_run1.json > /tmp/b1.log 2>&1
echo "rc $?" >> /tmp/b1.log
cat /tmp/b1.log >> $LOG; grep -vE "^\s*$" /tmp/b1.log | tail -80
