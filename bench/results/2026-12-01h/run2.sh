# eighth session, run 2: A / B in one session of the previous commit (5e42658, unpacked at ab/old) against the
# working tree: model_verify at B = 1 N = 32 (profiled) and N = 64, and at B = 16 N = 64, alternating old / new
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache
mv1() {  # tag dir B N extra...
  tag=$1; dir=$2; B=$3; N=$4; shift 4
  (cd $dir && PYTHONPATH=$PWD:$PWD/bench timeout 150 python3 bench/model_verify.py --B $B --L 1024 --N $N \
    --gdn-precisions tf32 "$@" --out $OUT/${tag}_B${B}_N${N}.json > $OUT/${tag}_B${B}_N${N}.log 2>&1)
  echo "$tag $(grep -E "^ +$B +1024" $OUT/${tag}_B${B}_N${N}.log | cut -c1-100)"
}
ROOT=$PWD
mv1 old $ROOT/ab/old 1 32 --profile --profile-nodes 32
mv1 new $ROOT 1 32 --profile --profile-nodes 32
mv1 old $ROOT/ab/old 1 64
mv1 new $ROOT 1 64
mv1 old $ROOT/ab/old 16 64
mv1 new $ROOT 16 64
mv1 old $ROOT/ab/old 1 32
mv1 new $ROOT 1 32
for t in old new; do grep -E "kernels,|^ +[0-9.]+ us +x" $OUT/${t}_B1_N32.log | cut -c1-100 | head -30; done
for t in old new; do grep -E "in issue order" $OUT/${t}_B1_N32.log | sed -n 2p | cut -c1-1400; done
