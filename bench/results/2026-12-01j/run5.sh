# tenth session, run 5 (the last of the session's device time): the GPU tests; the w_out GEMV with the per-head
# norm factors, its K tiles in pairs at half the stages or one at a time (bench/gate_norm_probe.py); the model with
# --segment-pairs on / off and --gdn-gate off at B = 1 (N = 64, 32, 16) and B = 16; the cold attention probe
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache
export PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run5.txt
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py tests/test_conv_kernels.py \
  tests/test_tree_attention.py tests/test_gemv.py tests/test_optimized_model.py tests/test_gdn_decode.py \
  tests/test_engine_optimized.py > /tmp/pytest.log 2>&1
cat /tmp/pytest.log >> $LOG; grep -E "passed|failed|Error" /tmp/pytest.log | tail -6
timeout 70 python3 bench/gate_norm_probe.py --rows 64 32 --out $OUT/gate_norm_probe.json > /tmp/probe.log 2>&1
cat /tmp/probe.log >> $LOG
python3 -c "
import json, os
for r in json.load(open(os.environ['OUT'] + '/gate_norm_probe.json'))['rows']:
    print(r['M'], ' '.join(f'{k}={v:.2f}' for k, v in r['us'].items()))
" 2>&1 | tail -3
mv1() {  # tag B N extra...
  tag=$1; B=$2; N=$3; shift 3
  timeout 60 python3 bench/model_verify.py --B $B --L 1024 --N $N --gdn-precisions tf32 "$@" \
    --out $OUT/mv_${tag}_B${B}_N${N}.json > /tmp/mv.log 2>&1
  echo "== $tag B=$B N=$N $*" >> $LOG; cat /tmp/mv.log >> $LOG
  echo "$tag $(grep -E "^ +$B +1024" /tmp/mv.log | cut -c1-100)"
}
mv1 pairs 1 64 --profile --profile-nodes 64
mv1 single 1 64 --segment-pairs off
mv1 nogate 1 64 --gdn-gate off
mv1 pairs 1 32
mv1 single 1 32 --segment-pairs off
mv1 pairs 1 64
mv1 single 1 64 --segment-pairs off
mv1 pairs 1 16
mv1 pairs 16 64
grep -E "in issue order" $LOG | head -1 | cut -c1-400
timeout 75 python3 bench/attention_probe.py --cold --budget-s 50 --out $OUT/attention_probe_cold.json > /tmp/ap.log 2>&1
cat /tmp/ap.log >> $LOG; grep -E "^B=|default" /tmp/ap.log | head -12
