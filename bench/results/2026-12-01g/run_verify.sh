# GPU tests of the touched modules, then the whole-model verify at N = 64 / 32 / 16 (B = 1, L = 1024)
export PYTHONPATH=$PWD:$PWD/bench PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 ${TESTS:-tests/test_gemv.py tests/test_conv_kernels.py tests/test_optimized_model.py tests/test_engine_optimized.py} 2>&1 | tail -4
for N in 64 32 16; do
  P=""; [ $N = 64 ] && P="--profile --profile-nodes 64"
  timeout 150 python3 bench/model_verify.py --B 1 --L 1024 --N $N --gdn-precisions tf32 $P --out $OUT/mv_N${N}.json 2>&1 | grep -E "in issue order|^ +1 +1024|Error|error|kernels," | cut -c1-1200
done
