#!/usr/bin/env bash
# One device call for the engine work (issue 7): GPU tests (TEST_FILES), then
# the end-to-end benchmark. Writes under $OUT: tests.log, e2e.{json,md,log,png}.
set -u
: "${OUT:?set OUT to the output folder}"
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache
start=$(date +%s)
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 ${TEST_FILES:-tests/test_gemv.py \
  tests/test_optimized_model.py tests/test_engine_optimized.py tests/test_demo_gpu_path.py} > "$OUT/tests.log" 2>&1
echo "tests rc=$? after $(( $(date +%s) - start )) s" >> "$OUT/tests.log"
timeout ${E2E_TIMEOUT:-360} python3 bench/e2e.py ${E2E_ARGS:---linear auto --batches 1 64 --acceptance 0.6 0.8 \
  --sweep 16 32 64 --time-limit 250} --out "$OUT/e2e.json" --markdown "$OUT/e2e.md" --plot "$OUT/e2e.png" \
  > "$OUT/e2e.log" 2>&1
echo "e2e rc=$? after $(( $(date +%s) - start )) s" >> "$OUT/e2e.log"
