# eighth session, run 3: where B = 16 decode and B = 1 N = 32 verify lost with SwiGLU in the gate | up epilogue:
# profiled model_verify, old (5e42658 at ab/old) and new, and the gate | up forms alone (bench/gemv.py --swiglu)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache
ROOT=$PWD
for t in old new; do
  d=$ROOT; [ $t = old ] && d=$ROOT/ab/old
  for BN in "16 64" "1 32"; do
    set -- $BN
    (cd $d && PYTHONPATH=$PWD:$PWD/bench timeout 150 python3 bench/model_verify.py --B $1 --L 1024 --N $2 \
      --gdn-precisions tf32 --profile --profile-nodes $2 --out /tmp/mv.json > /tmp/mv.log 2>&1)
    echo "== $t B=$1 N=$2"; grep -E "^ +$1 +1024" /tmp/mv.log | cut -c1-100
    grep -E "kernels,|^ +[0-9.]+ us +x" /tmp/mv.log | cut -c1-100 | head -22
    grep -E "in issue order" /tmp/mv.log | cut -c1-700
    cat /tmp/mv.log >> $OUT/logs.txt
  done
done
PYTHONPATH=$ROOT:$ROOT/bench timeout 200 python3 bench/gemv.py --swiglu --pdl --rows 1 16 32 64 --out $OUT/gemv_swiglu.json 2>&1 | tail -8
