# Twenty-first session, run 35: TMA apply / commit A / B (ab35.py), then the GPU tests of the kernels
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run35.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
timeout 330 python3 bench/results/2026-12-03/ab35.py 64 16 1 >> $LOG 2>&1; echo "ab rc $?" >> $LOG
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py >> $LOG 2>&1
echo "pytest rc $?" >> $LOG
grep -E "^\| |diff|rc |passed|failed|Error" $LOG | tail -40
