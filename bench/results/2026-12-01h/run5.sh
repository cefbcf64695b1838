# eighth session, run 5: the model's other kernels launched with PDL (--pdl-kernels on, the new default) against
# only the GEMV with PDL (off), B = 1 / 16 at N = 64 and B = 1 at N = 32 (profiled at N = 64); then the GPU tests
export PYTHONPATH=$PWD:$PWD/bench PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache
for v in "on" "off" "on"; do
  for BN in "1 16:64" "1:32"; do
    B=${BN%%:*}; N=${BN##*:}
    P=""; [ "$N" = 64 ] && [ "$v" = on ] && P="--profile --profile-nodes 64"
    timeout 200 python3 bench/model_verify.py --B $B --L 1024 --N $N --gdn-precisions tf32 --pdl-kernels $v $P \
      --out /tmp/mv.json > /tmp/mv.log 2>&1
    grep -E "^ +[0-9]+ +1024 " /tmp/mv.log | sed "s/^/$v /" | cut -c1-80
    grep -E "Error|error" /tmp/mv.log | head -3
    cat /tmp/mv.log >> $OUT/logs_run5.txt
  done
done
timeout 260 python3 -m pytest -q -m gpu -p no:cacheprovider -n 4 tests/test_gdn_kernels.py tests/test_conv_kernels.py tests/test_tree_attention.py tests/test_gemv.py tests/test_optimized_model.py tests/test_gdn_decode.py tests/test_engine_optimized.py tests/test_demo_gpu_path.py 2>&1 | tail -6
cp gpu_*.json $OUT/ 2>/dev/null; ls $OUT
