# fifteenth session, run 1: fp16 scratch vs fp32 scratch and the loads-ahead variants (probe.py), then the GPU tests
# of the GDN, conv and model kernels (not run on the GPU since the fourteenth session's run 6).
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
LOG=$OUT/logs_run1.txt
timeout 260 python3 bench/results/2026-12-02d/probe.py --out $OUT/probe_run1.json --budget-s 200 > /tmp/p.log 2>&1
echo "rc $?" >> /tmp/p.log
cat /tmp/p.log >> $LOG; grep -vE "built and checked" /tmp/p.log | tail -70
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py tests/test_conv_kernels.py \
  tests/test_optimized_model.py > /tmp/t.log 2>&1
echo "pytest rc $?" >> /tmp/t.log; cat /tmp/t.log >> $LOG; tail -8 /tmp/t.log
