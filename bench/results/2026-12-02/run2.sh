# (ran on the working tree before the deferred commit was removed; bench/results/2026-12-02/overlap_probe.py)
# twelfth session, run 2: GPU tests of the GDN kernels (deferred commit on a side stream, apply PDL), then the
# overlap probe (bench/results/2026-12-02/overlap_probe.py).
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run2.txt
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py > /tmp/pytest.log 2>&1
cat /tmp/pytest.log >> $LOG; grep -E "passed|failed|Error|assert" /tmp/pytest.log | tail -12
timeout 300 python3 bench/results/2026-12-02/overlap_probe.py --out $OUT/overlap.json 2>&1 | tee -a $LOG | tail -12
