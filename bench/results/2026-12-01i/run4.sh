# ninth session, run 4: the fused GDN verify kernel launched with PDL, its S0 tiles prefetched into L2 before the
# wait (model_verify --gdn-pdl on / off, same code), against the previous commit (ab/old); then the GDN GPU tests
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache
LOG=$OUT/logs_run4.txt
ROOT=$PWD
mv1() {  # tag dir B N extra...
  tag=$1; dir=$2; B=$3; N=$4; shift 4
  (cd $dir && PYTHONPATH=$PWD:$PWD/bench timeout 120 python3 bench/model_verify.py --B $B --L 1024 --N $N \
    --gdn-precisions tf32 "$@" --out /tmp/${tag}_B${B}_N${N}.json > /tmp/mv.log 2>&1)
  echo "== $tag B=$B N=$N $*" >> $LOG; cat /tmp/mv.log >> $LOG
  echo "$tag $(grep -E "^ +$B +1024" /tmp/mv.log | cut -c1-100)"
}
mv1 on $ROOT 1 64 --gdn-pdl on --profile --profile-nodes 64
mv1 off $ROOT 1 64 --gdn-pdl off
mv1 old $ROOT/ab/old 1 64
mv1 on $ROOT 1 32 --gdn-pdl on
mv1 off $ROOT 1 32 --gdn-pdl off
mv1 on $ROOT 1 64 --gdn-pdl on
mv1 off $ROOT 1 64 --gdn-pdl off
mv1 old $ROOT/ab/old 1 64
grep -E "in issue order" $LOG | head -1 | cut -c1-400
export PYTHONPATH=$PWD:$PWD/bench
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py tests/test_optimized_model.py 2>&1 | tail -3
