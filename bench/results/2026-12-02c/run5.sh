# fourteenth session, run 5: the fused kernel with its Gram products from the gram kernel (gram_splits) against the
# fused kernel and the split pipeline at B = 1 (probe), which launch form faulted at B = 1, N = 128 in run 4, and
# the GDN GPU tests.
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
LOG=$OUT/logs_run5.txt
timeout 300 python3 bench/results/2026-12-02c/b1_probe.py --out $OUT/b1_run5.json --budget-s 240 > /tmp/b1.log 2>&1
echo "rc $?" >> /tmp/b1.log
cat /tmp/b1.log >> $LOG; grep -vE "^\s*$" /tmp/b1.log | grep -v "built and checked" | grep -v '^ ' | tail -70
for form in fused split; do for launch in plain pdl; do
  timeout 60 python3 bench/results/2026-12-02c/crash128.py $form $launch > /tmp/c.log 2>&1
  echo "$form $launch rc $?: $(tail -c 300 /tmp/c.log)" | tee -a $LOG
done; done
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py > /tmp/t.log 2>&1
echo "pytest rc $?" >> /tmp/t.log; cat /tmp/t.log >> $LOG; tail -5 /tmp/t.log
