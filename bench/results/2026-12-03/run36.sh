# Twenty-first session, run 36: the solve through descriptors, the TMA apply's stages (ab35.py, AB_RUN=36), then the GPU tests of the kernels
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run36.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
AB_RUN=36 timeout 330 python3 bench/results/2026-12-03/ab35.py 64 16 1 >> $LOG 2>&1; echo "ab rc $?" >> $LOG
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py >> $LOG 2>&1
echo "pytest rc $?" >> $LOG
grep -E "^\| |diff|rc |passed|failed|Error" $LOG | tail -40
