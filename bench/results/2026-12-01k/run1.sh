# eleventh session, run 1 (written, not run: this session started with 57 s of device time left). For the next
# session's first device call: the GPU tests of the GDN kernels (the deferred commit's, in the solve's grid and
# folded, among them), then issue 5's benchmark at B = 64 and B = 1 (N = 64) with the commit deferred and folded
# beside commit-then-verify (deferred_* / folded_* in the JSON, their differences from commit-then-verify in
# *_diff_*), then the whole model at B = 1, N = 64 (issue 6's ratio after this session's kernel changes).
# fla-core 0.6.0 for the benchmark's peer columns, carried as a wheel: here, once,
#   echo /.whl/ >> .git/info/exclude; python3 -m pip download --no-deps --only-binary=:all: -d .whl fla-core==0.6.0
# and call the device with carry [".whl"]. Without it the benchmark still times ours (no AR / chunk columns).
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
LOG=$OUT/logs_run1.txt
timeout 170 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py tests/test_conv_kernels.py \
  > /tmp/pytest.log 2>&1
cat /tmp/pytest.log >> $LOG; grep -E "passed|failed|Error" /tmp/pytest.log | tail -6
timeout 280 python3 bench/gdn_tree.py --quick --modes tf32 --kinds random chain eagle star --fla-shapes 2 \
  --fla-budget-s 60 --budget-s 170 \
  --out $OUT/gdn_tree.json > /tmp/gt.log 2>&1
cat /tmp/gt.log >> $LOG; grep -E "^\| (64|1) \|" /tmp/gt.log
python3 -c "
import json, os
for r in json.load(open(os.environ['OUT'] + '/gdn_tree.json'))['rows']:
    print(r['B'], r['N'], r['kind'], {k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()
          if k.startswith(('ours_tf32_us', 'deferred_', 'folded_', 'verify_tf32', 'commit_tf32', 'ar_us'))})
" 2>&1 | tail -8
timeout 100 python3 bench/model_verify.py --B 1 --L 1024 --N 64 --gdn-precisions tf32 --out $OUT/mv_B1_N64.json \
  > /tmp/mv.log 2>&1
cat /tmp/mv.log >> $LOG; grep -E "^ +1 +1024" /tmp/mv.log | cut -c1-120
