# sixteenth session, run 6: (1) the fault case of runs 1-4 (ab.py at B = 16, all variants' graphs alive), then the
# same with no PDL anywhere; (2) fp16 scratch with the apply capped at 128 registers, and the commit capped at 128 /
# 96, at B = 64 (one variant's graphs alive at a time); (3) the GPU tests (GDN, conv, model files).
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
LOG=$OUT/logs_run6.txt
D=bench/results/2026-12-02e
which compute-sanitizer nsys ncu 2>&1 | tee -a $LOG; ls /usr/local/ 2>&1 | tee -a $LOG
for args in "16" "16 nopdl" "64 serial cap"; do
  timeout 110 python3 $D/ab.py $args > /tmp/a.log 2>&1
  echo "ab.py $args rc $?" >> /tmp/a.log; cat /tmp/a.log >> $LOG; grep -E "^\||rc |Error" /tmp/a.log | tail -9
done
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py tests/test_conv_kernels.py \
  tests/test_optimized_model.py > /tmp/t.log 2>&1
echo "pytest rc $?" >> /tmp/t.log; cat /tmp/t.log >> $LOG; tail -4 /tmp/t.log
