# Twenty-second session, run 40: the fused kernel's tiles through tensor descriptors (ab40.py), then the GPU tests of
# the kernels (test_gpu_tma_tiles_are_bit_exact now covers the fused kernel at B = 1, N = 32 / 128)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run40.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
timeout 360 python3 bench/results/2026-12-03/ab40.py >> $LOG 2>&1; echo "ab rc $?" >> $LOG
timeout 180 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py >> $LOG 2>&1
echo "pytest rc $?" >> $LOG
grep -E "^\| |diff|rc |passed|failed|Error|^B = " $LOG | tail -60
