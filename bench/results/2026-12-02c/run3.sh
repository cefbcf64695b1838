# fourteenth session, run 3: the B = 1 probe, the inverse with L dependent products (against the old loop) and |k|^2 from
# K K^T's diagonal; then the GDN kernels' GPU tests.
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
LOG=$OUT/logs_run3.txt
timeout 300 python3 bench/results/2026-12-02c/b1_probe.py --out $OUT/b1_run3.json > /tmp/b1.log 2>&1
echo "rc $?" >> /tmp/b1.log
cat /tmp/b1.log >> $LOG; grep -vE "^\s*$" /tmp/b1.log | grep -v "built and checked" | tail -100
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py > /tmp/t.log 2>&1
echo "pytest rc $?" >> /tmp/t.log; cat /tmp/t.log >> $LOG; tail -5 /tmp/t.log
