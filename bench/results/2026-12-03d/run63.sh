# Twenty-sixth session, run 63: issue 5's benchmark on the N = 128 defaults with the solve by row halves (c3ef64d +
# the --shapes option) at the headline and the N = 128 shapes, tf32, random trees and chains, fla-core 0.6.0 in the
# same run; then every default launch of the GDN tree kernels under compute-sanitizer memcheck (bench/sanitize_gdn.py)
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
LOG=$OUT/logs_run63.txt
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv >> $LOG
PYTHONPATH=$PYTHONPATH:/tmp/site timeout 330 python3 bench/gdn_tree.py --modes tf32 --kinds random chain \
  --shapes 64x64 64x128 1x128 16x128 1x64 --fla-shapes 5 --fla-budget-s 80 --budget-s 200 \
  --out $OUT/gdn_tree_run63.json >> $LOG 2>&1
echo "bench rc $?" >> $LOG
timeout 230 /usr/local/cuda/bin/compute-sanitizer --tool memcheck --print-limit 8 python3 bench/sanitize_gdn.py \
  >> $LOG 2>&1
echo "sanitizer rc $?" >> $LOG
grep -vE "Host Frame|^=========\s*$" $LOG | grep -E "rc |^\| |B=|ERROR|Out-of|at _|Error|budget" | tail -70
