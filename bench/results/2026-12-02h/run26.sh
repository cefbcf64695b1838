# prepared in the nineteenth session, not run (its device time ran out); run it on the library without the change:
# it keeps the library's gdn_tree.py as the old module and applies fused_gates_first.diff (gdn_tree.py and
# gdn_regs.py) itself. Run 26: the fused kernel (small batches at N != 64) with the gates and depths loaded before its
# K loop and used after it, up to N = 64 (fused_gates_first.diff; it had formed the decay before the loop, which
# waits for those loads before the loop's own loads issue, and read the depths after it) against the library's kernels
# (ab19.py, five rounds) at B = 1, N = 32 and 8; then the GPU tests of the GDN kernels
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache PYTHONPATH=$PWD:$PWD/bench
LOG=$OUT/logs_run26.txt
D=bench/results/2026-12-02h
nvidia-smi --query-gpu=name --format=csv >> $LOG
cp optimized/gdn_tree.py /tmp/old_gdn_tree.py && patch -s -p1 < $D/fused_gates_first.diff \
  && echo "old kernels kept, the change applied" >> $LOG
for n in 32 8; do
  AB_N=$n timeout 60 python3 $D/ab19.py 1 /tmp/old_gdn_tree.py > /tmp/a_n$n.log 2>&1
  echo "ab19.py 1 N $n rc $?" >> /tmp/a_n$n.log; cat /tmp/a_n$n.log >> $LOG
  grep -E "^\||rc |Error|diff" /tmp/a_n$n.log | tail -9
done
timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py > /tmp/t.log 2>&1
echo "pytest rc $?" >> /tmp/t.log; cat /tmp/t.log >> $LOG; tail -3 /tmp/t.log
