# ninth session, run 7 (written, not run: the session's device time was spent): the final code's GPU test suite,
# the whole-model numbers at B = 1 (N = 64 / 32 / 16, profiled at 64) and B = 16, the cold attention probe (the
# attention's PDL launch and the skipped empty splits are new since run 1), then the end-to-end bench
export PYTHONPATH=$PWD:$PWD/bench PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache
timeout 230 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py tests/test_conv_kernels.py \
  tests/test_tree_attention.py tests/test_gemv.py tests/test_optimized_model.py tests/test_gdn_decode.py \
  tests/test_engine_optimized.py tests/test_demo_gpu_path.py 2>&1 | tail -3
cp gpu_*.json $OUT/ 2>/dev/null
for BN in "1:64" "1:32" "1:16" "16:64"; do
  B=${BN%%:*}; N=${BN##*:}
  P=""; [ "$BN" = "1:64" ] && P="--profile --profile-nodes 64"
  timeout 150 python3 bench/model_verify.py --B $B --L 1024 --N $N --gdn-precisions tf32 $P \
    --out /tmp/mv_B${B}_N${N}.json > /tmp/mv.log 2>&1
  grep -E "^ +[0-9]+ +1024 " /tmp/mv.log | cut -c1-120
  cat /tmp/mv.log >> $OUT/logs_run7.txt
done
timeout 100 python3 bench/attention_probe.py --cold --budget-s 80 --out $OUT/attention_probe_cold.json > /tmp/probe.log 2>&1
grep -E "^B=|default" /tmp/probe.log | head -12
