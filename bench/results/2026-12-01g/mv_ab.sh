export PYTHONPATH=$PWD:$PWD/bench PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache
for N in 64 32 16; do for R in 64 0; do
  P=""; [ $N = 64 ] && P="--profile --profile-nodes 64"
  timeout 150 python3 bench/model_verify.py --B 1 --L 1024 --N $N --gdn-precisions tf32 $P --gemv-rows $R --out $OUT/mv_N${N}_rows$R.json 2>&1 | grep -E "in issue order|^ +1 +1024|Error|error" | cut -c1-1500
done; done
