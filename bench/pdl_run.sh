#!/usr/bin/env bash
# One device call for the PDL / GEMV / engine-overhead work (issue 7): GPU tests of every kernel the decode step and
# the engine use, then bench/model_verify.py (decode with and without PDL, verify, profile) and
# bench/engine_step_profile.py. Writes under $OUT: tests.log, model_verify.{json,log}, engine_profile.{json,log}.
set -u
: "${OUT:?set OUT to the output folder}"
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache
start=$(date +%s)
timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 ${TEST_FILES:-tests/test_gemv.py \
  tests/test_gdn_decode.py tests/test_tree_attention.py tests/test_optimized_model.py tests/test_engine_optimized.py \
  tests/test_demo_gpu_path.py} > "$OUT/tests.log" 2>&1
echo "tests rc=$? after $(( $(date +%s) - start )) s" >> "$OUT/tests.log"
timeout 200 python3 bench/model_verify.py ${MODEL_ARGS:---B 1 16 --L 1024 --N 64 --gdn-precisions tf32 --pdl both \
  --profile} --out "$OUT/model_verify.json" > "$OUT/model_verify.log" 2>&1
echo "model_verify rc=$? after $(( $(date +%s) - start )) s" >> "$OUT/model_verify.log"
timeout 120 python3 bench/engine_step_profile.py --out "$OUT/engine_profile.json" > "$OUT/engine_profile.log" 2>&1
echo "engine_profile rc=$? after $(( $(date +%s) - start )) s" >> "$OUT/engine_profile.log"
