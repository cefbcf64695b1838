# thirteenth session, run 1: GPU tests of the GDN kernels, the conv kernels and the optimized model with the packed
# [N, N] tile, then pack_probe.py (packed against two tiles, and the apply's tf32 rounding measured).
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run1.txt
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py tests/test_conv_kernels.py \
  tests/test_optimized_model.py > /tmp/pytest.log 2>&1
cat /tmp/pytest.log >> $LOG; grep -E "passed|failed|Error|assert" /tmp/pytest.log | tail -12
timeout 300 python3 bench/results/2026-12-02b/pack_probe.py --old bench/results/2026-12-02b/old_gdn_tree.py \
  --out $OUT/pack_run1.json > /tmp/probe.log 2>&1
cat /tmp/probe.log >> $LOG; tail -c 5000 /tmp/probe.log
