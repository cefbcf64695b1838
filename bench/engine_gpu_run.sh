#!/usr/bin/env bash
# One device call for the engine / decode-path work (issue 7): phase 1 runs the engine's GPU tests
# (tests/test_engine_optimized.py incl. the 10^4-step long run, tests/test_demo_gpu_path.py, tests/test_gemv.py) with
# a compile-only warm-up of bench/model_verify.py beside them; phase 2 times bench/model_verify.py on a quiet GPU
# (MODEL_ARGS, with the GEMV and then with cuBLAS for the decode projections) with a kernel profile of decode and
# verify at the first point. Writes under $OUT: gpu.txt, tests.log, model_verify_{gemv,cublas}.{json,log}.
set -u
: "${OUT:?set OUT to the output folder}"
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/gpu.txt"
MODEL_ARGS="${MODEL_ARGS:---B 1 16 --L 1024 --N 64 --gdn-precisions tf32}"
TEST_FILES="${TEST_FILES:-tests/test_engine_optimized.py tests/test_demo_gpu_path.py tests/test_gemv.py}"
start=$(date +%s)
timeout 320 python3 -m pytest -q -m gpu -p no:cacheprovider -s $TEST_FILES > "$OUT/tests.log" 2>&1 &
tests_pid=$!
timeout 150 python3 bench/model_verify.py $MODEL_ARGS --compile-only > "$OUT/warm.log" 2>&1
wait $tests_pid; echo "tests rc=$? after $(( $(date +%s) - start )) s" >> "$OUT/tests.log"
for linear in gemv cublas; do
  prof=""; [ "$linear" = gemv ] && prof="--profile"
  timeout 130 python3 bench/model_verify.py $MODEL_ARGS --linear $linear $prof --out "$OUT/model_verify_$linear.json" \
    > "$OUT/model_verify_$linear.log" 2>&1
  echo "model_verify $linear rc=$? after $(( $(date +%s) - start )) s" >> "$OUT/model_verify_$linear.log"
done
