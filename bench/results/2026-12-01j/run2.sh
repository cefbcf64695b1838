# tenth session, run 2: the w_out GEMV's per-head norm factors loaded before its K loop (run 1 loaded them per
# tile: w_out 10.8 -> 16.5 us), scaling the tiles' products (--gdn-gate on) or the x tiles (x), z loaded early in
# the verify kernel; against --gdn-gate off; profiles at N = 64
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache
LOG=$OUT/logs_run2.txt
ROOT=$PWD
mv1() {  # tag dir B N extra...
  tag=$1; dir=$2; B=$3; N=$4; shift 4
  (cd $dir && PYTHONPATH=$PWD:$PWD/bench timeout 120 python3 bench/model_verify.py --B $B --L 1024 --N $N \
    --gdn-precisions tf32 "$@" --out /tmp/${tag}_B${B}_N${N}.json > /tmp/mv.log 2>&1)
  echo "== $tag B=$B N=$N $*" >> $LOG; cat /tmp/mv.log >> $LOG
  echo "$tag $(grep -E "^ +$B +1024" /tmp/mv.log | cut -c1-100)"
  grep -E "in issue order" /tmp/mv.log | head -1 | cut -c1-330
}
mv1 gate $ROOT 1 64 --gdn-gate on --profile --profile-nodes 64
mv1 gatex $ROOT 1 64 --gdn-gate x --profile --profile-nodes 64
mv1 nogate $ROOT 1 64 --gdn-gate off --profile --profile-nodes 64
mv1 gate $ROOT 1 32 --gdn-gate on
mv1 gatex $ROOT 1 32 --gdn-gate x
mv1 nogate $ROOT 1 32 --gdn-gate off
mv1 gate $ROOT 1 64 --gdn-gate on
mv1 gatex $ROOT 1 64 --gdn-gate x
mv1 nogate $ROOT 1 64 --gdn-gate off
