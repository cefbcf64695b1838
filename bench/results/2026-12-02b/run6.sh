# thirteenth session, run 6: fla 0.6.0's baselines checked against the float64 closed form (decode step, chunk kernel,
# branch by branch with 3 and with 1 pipeline stage), each job in its own process.
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=$PYTHONPATH:/tmp/site
timeout 560 python3 bench/results/2026-12-02b/fla_check.py --out $OUT/fla_check_run6.json 2>&1 | tee $OUT/logs_run6.txt \
  | cut -c1-400
