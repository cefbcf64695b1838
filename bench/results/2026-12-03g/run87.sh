# Run 87: where run 86's norm-partition errors lie (o only: 2.4-2.9e-3 for FOLD 25 / 27, Delta and the state
# right; 28 right). --rows prints, after the first launch and after the timing, which rows of o miss the float64
# closed form by more than 1e-2, in which items, their best-fit scale (a wrong q norm scales a row) and the
# residual after it: 27 twice at 192 solver registers, 25, 28, and 23 (norms in the solve) as a control.
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run87.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 300 python3 bench/results/2026-12-03g/gluon_probe.py --rows \
  --variants "16,3,27,8,192,4;16,3,27,8,192,4;16,3,25,8,184,4;16,3,28,8,192,4;16,3,23,8,184,4" \
  --out $OUT/gluon_probe_run87.json >> $LOG 2>&1
echo "gluon_probe rc $?" >> $LOG
grep -E '^\||^check|^rows|rc |copy|random trees|Error|error' $LOG | tail -40
