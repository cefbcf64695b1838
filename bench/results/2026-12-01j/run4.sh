# tenth session, run 4: the w_out GEMV with the per-head norm factors, its K tiles in pairs (two products in flight
# before the first waits) or one at a time, per config (bench/gate_norm_probe.py); then the model: --gdn-gate on
# (4 and 8 warps for that GEMV) / off
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache
export PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run4.txt
timeout 200 python3 bench/gate_norm_probe.py --rows 64 32 --out $OUT/gate_norm_probe.json > /tmp/probe.log 2>&1
cat /tmp/probe.log >> $LOG
python3 - <<'PY'
import json
for r in json.load(open("/tmp/probe.json" if False else __import__("os").environ["OUT"] + "/gate_norm_probe.json"))["rows"]:
    print(r["M"], " ".join(f"{k}={v:.2f}" for k, v in r["us"].items()))
PY
mv1() {  # tag B N extra...
  tag=$1; B=$2; N=$3; shift 3
  timeout 120 python3 bench/model_verify.py --B $B --L 1024 --N $N --gdn-precisions tf32 "$@" \
    --out /tmp/${tag}_B${B}_N${N}.json > /tmp/mv.log 2>&1
  echo "== $tag B=$B N=$N $*" >> $LOG; cat /tmp/mv.log >> $LOG
  echo "$tag $(grep -E "^ +$B +1024" /tmp/mv.log | cut -c1-100)"
}
mv1 gate4 1 64 --gdn-gate on --segment-warps 4
mv1 gate8 1 64 --gdn-gate on --segment-warps 8
mv1 nogate 1 64 --gdn-gate off
mv1 gate4 1 32 --gdn-gate on --segment-warps 4
mv1 gate8 1 32 --gdn-gate on --segment-warps 8
mv1 gate4 1 64 --gdn-gate on --segment-warps 4
mv1 gate8 1 64 --gdn-gate on --segment-warps 8
mv1 nogate 1 64 --gdn-gate off
