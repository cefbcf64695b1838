# eighth session, run 4: A / B knobs of bench/model_verify.py, all in one session: SwiGLU in the gate | up epilogue
# at every row count or its own kernel above 8 rows (--swiglu-rows 8), and the GEMV's PDL signal before or after
# its wait (--pdl-trigger); B = 1 and 16 at N = 64, B = 1 at N = 32
export PYTHONPATH=$PWD:$PWD/bench PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/lumotree-triton-cache
for v in "A" "B --swiglu-rows 8" "C --pdl-trigger late" "D --swiglu-rows 8 --pdl-trigger late"; do
  set -- $v; tag=$1; shift
  for BN in "1 16:64" "1:32"; do
    B=${BN%%:*}; N=${BN##*:}
    timeout 200 python3 bench/model_verify.py --B $B --L 1024 --N $N --gdn-precisions tf32 "$@" \
      --out /tmp/mv.json > /tmp/mv.log 2>&1
    grep -E "^ +[0-9]+ +1024 " /tmp/mv.log | sed "s/^/$tag /" | cut -c1-80
    cat /tmp/mv.log >> $OUT/logs_run4.txt
  done
done
