#!/usr/bin/env bash
# One device call for the tree-attention / decode-path work (bench/NOTES-attention.md): the GPU tests of
# tests/test_tree_attention.py, tests/test_gdn_decode.py, tests/test_optimized_model.py, then the timings of
# bench/tree_attention.py (points below) and bench/model_verify.py (B 1 and 16, L 8k, with a kernel profile; TREE_POINTS and MODEL_ARGS override).
# Phase 1 runs the tests and compile-only warm-ups of every timed point in parallel (Triton compiles on the CPU, one
# kernel at a time per process; the on-disk cache is shared), phase 2 times one thing at a time on a quiet GPU.
# Writes under $OUT: gpu.txt, tests.log, warm.log, tree_attention.{json,log}, model_verify.{json,log}.
set -u
: "${OUT:?set OUT to the output folder}"
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw \
  --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$OUT/gpu.txt"

TREE_POINTS="${TREE_POINTS:-1:8192:64 16:8192:64 64:8192:64 1:8192:128 1:1024:64:d}"
MODEL_ARGS="${MODEL_ARGS:---B 1 16 --L 8192 --N 64 --gdn-precisions ieee tf32x3 tf32}"
start=$(date +%s)

# ---- phase 1 (parallel): correctness tests + cache warm-up
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_tree_attention.py tests/test_gdn_decode.py \
  tests/test_optimized_model.py > "$OUT/tests.log" 2>&1 &
tests_pid=$!
warm_pids=()
for p in $TREE_POINTS; do
  diag=""; [ "$p" = "1:8192:64" ] && diag="--diagnose"
  timeout 90 python3 bench/tree_attention.py --points "$p" --compile-only $diag > "/tmp/warm_$p.log" 2>&1 &
  warm_pids+=($!)
done
timeout 90 python3 bench/model_verify.py $MODEL_ARGS --compile-only > /tmp/warm_model.log 2>&1 &
warm_pids+=($!)
for pid in "${warm_pids[@]}"; do wait "$pid" || echo "warm-up process $pid exited with $?"; done
tail -n 3 /tmp/warm_*.log > "$OUT/warm.log" 2>&1
echo "phase 1 (warm-up) done after $(( $(date +%s) - start )) s" | tee -a "$OUT/warm.log"
wait "$tests_pid"; echo "gpu tests exit $? after $(( $(date +%s) - start )) s" | tee -a "$OUT/tests.log"

# ---- phase 2 (sequential): timings
timeout 55 python3 bench/tree_attention.py --points $TREE_POINTS --diagnose --out "$OUT/tree_attention.json" \
  > "$OUT/tree_attention.log" 2>&1
echo "tree attention exit $? after $(( $(date +%s) - start )) s"
timeout 75 python3 bench/model_verify.py $MODEL_ARGS --profile --out "$OUT/model_verify.json" \
  > "$OUT/model_verify.log" 2>&1
echo "model exit $? after $(( $(date +%s) - start )) s"
tail -n 4 "$OUT/tests.log"
grep -E "^ +[0-9]|^[a-z_0-9]+ \{|replay floor" "$OUT/tree_attention.log" | tail -n 16
tail -n 40 "$OUT/model_verify.log"
