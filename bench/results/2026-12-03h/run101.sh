# Run 101: the probe's FOLD 28 kernel and the library's fused step, kernel by kernel (probe_profile.py)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run101.txt
PYTHONPATH=$PYTHONPATH:/tmp/site OUT=$OUT timeout 250 python3 bench/results/2026-12-03h/probe_profile.py >> $LOG 2>&1
echo "probe_profile rc $?" >> $LOG
grep -E '^\||^  |kernels| rc |Error' $LOG | tail -40
