# Twenty-first session, run 37: descriptors in the other modes and sizes (ab35.py, AB_RUN=37), then the GPU tests of the kernels
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run37.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
AB_RUN=37 timeout 420 python3 bench/results/2026-12-03/ab35.py >> $LOG 2>&1; echo "ab rc $?" >> $LOG
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py >> $LOG 2>&1
echo "pytest rc $?" >> $LOG
grep -E "^\| |diff|rc |passed|failed|Error" $LOG | tail -40
