# ninth session, run 1: A / B in one session of the previous commit (01df6a9, unpacked at ab/old) against the working
# tree (gated RMSNorm in the GDN verify's epilogue, the attention combine reading only splits with keys), the tree
# conv epilogue probe (4 / 8 warps, one-hot taps), the cold attention probe, then the GPU tests of the changed files
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache
LOG=$OUT/logs_run1.txt
mv1() {  # tag dir B N extra...
  tag=$1; dir=$2; B=$3; N=$4; shift 4
  (cd $dir && PYTHONPATH=$PWD:$PWD/bench timeout 120 python3 bench/model_verify.py --B $B --L 1024 --N $N \
    --gdn-precisions tf32 "$@" --out /tmp/${tag}_B${B}_N${N}.json > /tmp/mv.log 2>&1)
  echo "== $tag B=$B N=$N $*" >> $LOG; cat /tmp/mv.log >> $LOG
  echo "$tag $(grep -E "^ +$B +1024" /tmp/mv.log | cut -c1-100)"
}
ROOT=$PWD
mv1 old $ROOT/ab/old 1 64
mv1 new $ROOT 1 64 --profile --profile-nodes 64
mv1 old $ROOT/ab/old 1 32
mv1 new $ROOT 1 32
mv1 old $ROOT/ab/old 16 64
mv1 new $ROOT 16 64
mv1 old $ROOT/ab/old 1 64
mv1 new $ROOT 1 64
grep -E "kernels,|^ +[0-9.]+ us +x" $LOG | cut -c1-100 | head -24
export PYTHONPATH=$PWD:$PWD/bench
timeout 90 python3 bench/treeconv_probe.py --nodes 16 32 64 --out $OUT/treeconv_probe.json 2>&1 | tail -4
timeout 90 python3 bench/attention_probe.py --cold --budget-s 60 --out $OUT/attention_probe_cold.json > /tmp/probe.log 2>&1
grep -E "^B=|default" /tmp/probe.log | head -12; cat /tmp/probe.log >> $LOG
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py tests/test_tree_attention.py tests/test_gemv.py tests/test_optimized_model.py tests/test_gdn_decode.py 2>&1 | tail -4
