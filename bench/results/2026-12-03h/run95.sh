# Run 95: the library's fused verify against switch variants (fused_variants.py), then the probe's FOLD 28
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run95.txt
timeout 300 python3 bench/results/2026-12-03h/fused_variants.py $OUT/fused_variants_run95.json >> $LOG 2>&1
echo "variants rc $?" >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 150 python3 bench/results/2026-12-03g/gluon_probe.py \
  --variants "16,3,28,8,192,4" --out $OUT/gluon_probe_run95.json >> $LOG 2>&1
echo "gluon_probe rc $?" >> $LOG
grep -E 'us |^\||rc |Error|error' $LOG | tail -30
