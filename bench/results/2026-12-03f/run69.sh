# Twenty-ninth session, run 69: the split apply's ladder (bytes only, K-loop products, all products) against the
# library apply, verify and commit, the commit's read-modify-write and fla-core 0.6.0's decode step, B = 64, N = 64;
# the fold stage with the previous commit's path terms and Delta stored (commit); --fold-sweep at run 67's best tilings
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run69.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 400 python3 bench/results/2026-12-03f/apply_probe.py --fold-sweep \
  --out $OUT/apply_probe_run69.json >> $LOG 2>&1
echo "apply_probe rc $?" >> $LOG
grep -E 'sweep|^\| |copy|rc ' $LOG | tail -90
