# tenth session, run 7 (the final code, 13af6e3: one tile at a time and 8 warps above 32 rows by default; the
# bench's --segment-pairs auto): B = 1, N = 64 twice, no knobs. (Between run 6 and this one a run with the bench's
# old --segment-pairs default "on" measured the pairs again: 2065.6 / 2065.3 us.)
export PYTHONPATH=$PWD:$PWD/bench TRITON_CACHE_DIR=/tmp/lumotree-triton-cache
for a in 1 2; do
  timeout 30 python3 bench/model_verify.py --B 1 --L 1024 --N 64 --gdn-precisions tf32 --out /tmp/x.json 2>&1 \
    | grep -E "^ +1 +1024" | sed "s/^/final /"
done
# output:
# final    1   1024   64    1339.8    2009.2     47.5   1.50   1.54   1046.5    921.6   1.45    347.8
# final    1   1024   64    1339.9    2009.0     47.6   1.50   1.53   1046.9    921.9   1.45    341.9
