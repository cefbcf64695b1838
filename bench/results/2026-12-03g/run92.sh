# Run 92: the deferred commit's record step (record_probe.py: a Triton kernel, one program per (request, value
# head), the benchmark's accepted nodes) in its two layouts, checked against torch, timed beside gluon_probe's
# FOLD 28 verify (q / k normalised in the kernel) and fla-core 0.6.0's decode step, B = N = 64; then gluon_probe's
# FOLD 34 (28 with each updated chunk staged in a tile of its own, its TMA store awaited a chunk later, the
# products issued first) beside 28
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run92.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 300 python3 bench/results/2026-12-03g/record_probe.py \
  --out $OUT/record_probe_run92.json >> $LOG 2>&1
echo "record_probe rc $?" >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 200 python3 bench/results/2026-12-03g/gluon_probe.py \
  --variants "16,3,34,8,192,4;16,3,28,8,192,4" --out $OUT/gluon_probe_run92.json >> $LOG 2>&1
echo "gluon_probe rc $?" >> $LOG
grep -E '^\||^check|rc |copy|accepted|record|Error|error' $LOG | tail -30
