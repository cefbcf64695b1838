# ninth session, run 3: the tree conv epilogue with its conv weights and committed-state taps loaded before the K
# loop (bench/treeconv_probe.py), then A / B against the previous commit (ab/old) of the working tree (that, and the
# attention's empty splits skipped at tree sizes only), then the GPU tests of the changed files
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache
LOG=$OUT/logs_run3.txt
ROOT=$PWD
export PYTHONPATH=$PWD:$PWD/bench
timeout 90 python3 bench/treeconv_probe.py --nodes 16 32 64 --out $OUT/treeconv_probe.json 2>&1 | tail -3
mv1() {  # tag dir B N extra...
  tag=$1; dir=$2; B=$3; N=$4; shift 4
  (cd $dir && PYTHONPATH=$PWD:$PWD/bench timeout 120 python3 bench/model_verify.py --B $B --L 1024 --N $N \
    --gdn-precisions tf32 "$@" --out /tmp/${tag}_B${B}_N${N}.json > /tmp/mv.log 2>&1)
  echo "== $tag B=$B N=$N $*" >> $LOG; cat /tmp/mv.log >> $LOG
  echo "$tag $(grep -E "^ +$B +1024" /tmp/mv.log | cut -c1-100)"
}
mv1 old $ROOT/ab/old 1 64
mv1 new $ROOT 1 64 --profile --profile-nodes 64
mv1 old $ROOT/ab/old 1 32
mv1 new $ROOT 1 32
mv1 old $ROOT/ab/old 1 64
mv1 new $ROOT 1 64
mv1 old $ROOT/ab/old 16 64
mv1 new $ROOT 16 64
grep -E "in issue order" $LOG | head -1 | cut -c1-700
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_tree_attention.py tests/test_gemv.py tests/test_optimized_model.py 2>&1 | tail -3
