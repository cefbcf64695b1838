# tenth session, run 3: the w_out GEMV with the per-head norm factors per launch config (bench/gate_norm_probe.py),
# then the model with the verify's norm pieces as one row sum per V block (no reshape), --gdn-gate on / off
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache
export PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run3.txt
timeout 150 python3 bench/gate_norm_probe.py --rows 64 32 --out $OUT/gate_norm_probe.json 2>&1 | tee -a $LOG | cut -c1-900
mv1() {  # tag B N extra...
  tag=$1; B=$2; N=$3; shift 3
  timeout 120 python3 bench/model_verify.py --B $B --L 1024 --N $N --gdn-precisions tf32 "$@" \
    --out /tmp/${tag}_B${B}_N${N}.json > /tmp/mv.log 2>&1
  echo "== $tag B=$B N=$N $*" >> $LOG; cat /tmp/mv.log >> $LOG
  echo "$tag $(grep -E "^ +$B +1024" /tmp/mv.log | cut -c1-100)"
  grep -E "in issue order" /tmp/mv.log | head -1 | cut -c1-200
}
mv1 gate 1 64 --gdn-gate on --profile --profile-nodes 64
mv1 nogate 1 64 --gdn-gate off --profile --profile-nodes 64
mv1 gate 1 32 --gdn-gate on
mv1 nogate 1 32 --gdn-gate off
mv1 gate 1 64 --gdn-gate on
mv1 nogate 1 64 --gdn-gate off
