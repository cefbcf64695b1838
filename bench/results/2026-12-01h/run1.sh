# eighth session, run 1: GPU tests of the touched modules; the whole-model verify at N = 64 / 32 / 16 and decode
# (B = 1, L = 1024) and B = 16 N = 64; the cold attention probe (4 / 5 stage variants)
export PYTHONPATH=$PWD:$PWD/bench PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gemv.py tests/test_conv_kernels.py tests/test_tree_attention.py tests/test_optimized_model.py 2>&1 | tail -4
for N in 64 32 16; do
  P=""; [ $N = 64 ] && P="--profile --profile-nodes 64"
  timeout 150 python3 bench/model_verify.py --B 1 --L 1024 --N $N --gdn-precisions tf32 $P --out $OUT/mv_N${N}.json > $OUT/mv_N${N}.log 2>&1
  grep -E "^ +1 +1024|Error|error" $OUT/mv_N${N}.log | cut -c1-600
done
grep -E "kernels,|^ +[0-9.]+ us +x" $OUT/mv_N64.log | cut -c1-110 | head -40
grep -E "in issue order" $OUT/mv_N64.log | cut -c1-1500
timeout 200 python3 bench/model_verify.py --B 16 --L 1024 --N 64 --gdn-precisions tf32 --out $OUT/mv_B16.json > $OUT/mv_B16.log 2>&1
grep -E "^ +16 +1024|Error|error" $OUT/mv_B16.log | cut -c1-600
timeout 150 python3 bench/attention_probe.py --cold --budget-s 120 --out $OUT/attention_probe_cold.json > $OUT/probe.log 2>&1
tail -40 $OUT/probe.log
