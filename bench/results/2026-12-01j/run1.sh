# tenth session, run 1: the tree step's metadata in the step prologue launch and the gated RMSNorm split between
# the GDN verify kernel and the w_out GEMV (model_verify --gdn-gate on / off), the previous session's last commit
# (fc17f29, ab/old) beside; then the GPU tests of the changed files
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache
LOG=$OUT/logs_run1.txt
ROOT=$PWD
mv1() {  # tag dir B N extra...
  tag=$1; dir=$2; B=$3; N=$4; shift 4
  (cd $dir && PYTHONPATH=$PWD:$PWD/bench timeout 120 python3 bench/model_verify.py --B $B --L 1024 --N $N \
    --gdn-precisions tf32 "$@" --out /tmp/${tag}_B${B}_N${N}.json > /tmp/mv.log 2>&1)
  echo "== $tag B=$B N=$N $*" >> $LOG; cat /tmp/mv.log >> $LOG
  echo "$tag $(grep -E "^ +$B +1024" /tmp/mv.log | cut -c1-100)"
}
mv1 gate $ROOT 1 64 --profile --profile-nodes 64
mv1 nogate $ROOT 1 64 --gdn-gate off
mv1 old $ROOT/ab/old 1 64
mv1 gate $ROOT 1 32
mv1 nogate $ROOT 1 32 --gdn-gate off
mv1 gate $ROOT 1 64
mv1 old $ROOT/ab/old 1 64
mv1 gate $ROOT 16 64
mv1 nogate $ROOT 16 64 --gdn-gate off
grep -E "in issue order" $LOG | head -1 | cut -c1-700
export PYTHONPATH=$PWD:$PWD/bench
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py tests/test_gemv.py \
  tests/test_tree_attention.py tests/test_optimized_model.py 2>&1 | grep -E "passed|failed|Error|assert" | tail -8
