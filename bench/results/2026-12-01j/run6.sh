# tenth session, run 6 (ad hoc, on the warm machine right after run 5; output below): the w_out GEMV with the
# per-head norm factors one tile at a time at 8 and 4 warps, B = 1, N = 64
export PYTHONPATH=$PWD:$PWD/bench TRITON_CACHE_DIR=/tmp/lumotree-triton-cache
for a in "8" "4" "8" "4"; do
  timeout 35 python3 bench/model_verify.py --B 1 --L 1024 --N 64 --gdn-precisions tf32 --segment-pairs off \
    --segment-warps $a --out /tmp/x.json 2>&1 | grep -E "^ +1 +1024" | sed "s/^/w$a /"
done
# output (B, L, N, decode, verify, commit, x_ver, ...):
# w8    1   1024   64    1341.0    2008.6     47.5   1.50   1.53   1046.8    921.8   1.45    341.9
# w4    1   1024   64    1339.8    2024.1     47.7   1.51   1.55   1046.8    921.9   1.45    345.6
# w8    1   1024   64    1341.2    2010.6     47.6   1.50   1.53   1046.6    921.7   1.46    349.1
# w4    1   1024   64    1341.3    2026.3     47.7   1.51   1.55   1046.8    921.9   1.45    340.6
