# Thirtieth session, run 77: the fused data flow with the tree's own math (real: the bench's random trees, ancestor
# bitsets, decays from g, beta, QKD = scale Q K^T ⊙ D, Gamma to the consumer), checked against the library's
# float64 closed form on the committed state, at 176 / 184 / 192 solver registers, beside ahead-smem, the Triton
# stand-in and fla-core 0.6.0's decode step, B = N = 64
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run77.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 240 python3 bench/results/2026-12-03g/gluon_probe.py \
  --variants "16,3,8,8,184,4;16,3,8,8,176,4;16,3,8,8,192,4;16,3,7,8,184" --out $OUT/gluon_probe_run77.json >> $LOG 2>&1
echo "gluon_probe rc $?" >> $LOG
grep -E '^\||^check|rc |copy|random trees|Error|error' $LOG | tail -30
