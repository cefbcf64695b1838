# ninth session, run 6 (final code): the GDN verify's gated RMSNorm launched with PDL behind a verify kernel that
# signals (model_verify --gdn-pdl on / off, which also switches the verify's own PDL launch), the attention's PDL
# launch at B = 1 only; the previous commit (ab/old) beside; then the GPU tests of the changed files
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache
LOG=$OUT/logs_run6.txt
ROOT=$PWD
mv1() {  # tag dir B N extra...
  tag=$1; dir=$2; B=$3; N=$4; shift 4
  (cd $dir && PYTHONPATH=$PWD:$PWD/bench timeout 100 python3 bench/model_verify.py --B $B --L 1024 --N $N \
    --gdn-precisions tf32 "$@" --out /tmp/${tag}_B${B}_N${N}.json > /tmp/mv.log 2>&1)
  echo "== $tag B=$B N=$N $*" >> $LOG; cat /tmp/mv.log >> $LOG; cp /tmp/${tag}_B${B}_N${N}.json $OUT/ 2>/dev/null
  echo "$tag $(grep -E "^ +$B +1024" /tmp/mv.log | cut -c1-100)"
}
mv1 new $ROOT 1 64 --profile --profile-nodes 64
mv1 off $ROOT 1 64 --gdn-pdl off
mv1 old $ROOT/ab/old 1 64
mv1 new2 $ROOT 1 64
mv1 off2 $ROOT 1 64 --gdn-pdl off
mv1 new $ROOT 16 64
mv1 off $ROOT 16 64 --gdn-pdl off
grep -E "in issue order" $LOG | head -1 | cut -c1-500
export PYTHONPATH=$PWD:$PWD/bench
timeout 110 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py tests/test_tree_attention.py tests/test_optimized_model.py tests/test_gdn_decode.py tests/test_gemv.py 2>&1 | grep -E "passed|failed|Error" | tail -6
