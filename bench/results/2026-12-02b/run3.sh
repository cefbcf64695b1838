# thirteenth session, run 3: the packed triangles loaded without masks (the working tree) against run 2's masked
# loads and the committed two square tiles.
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run3.txt
timeout 200 python3 bench/results/2026-12-02b/pack_probe.py --old bench/results/2026-12-02b/old_gdn_tree.py \
  --name triangles_unmasked --masked --out $OUT/tri_run3.json > /tmp/probe.log 2>&1
cat /tmp/probe.log >> $LOG; tail -c 3000 /tmp/probe.log
