"""Twenty-sixth session, run 64: the N = 128 cases run 62 left out, and the defaults after the doubling's first
product got a region of its own (no product of a default tf32 kernel over-covers its rows any more, compile-only),
same-run A / B, verify + commit.

- tf32x3 at N = 128, where Triton's three-product split chains every product (so at 8 warps each one over-covers
  a 64-row tile): B = 64, 16 the default (one 8-warp 3-stage solve program per value head) against the solve by row
  halves at 4 warps / 2 stages and 8 warps / 2 stages; B = 1 the default (8-warp rows solve) against 4 warps;
- bf16 q / k / v in tf32 at N = 128 (the rules were set on fp32 inputs): B = 1 the new default (split, 8-warp rows
  solve, 64-column descriptor apply) against the fused kernel of the old default; B = 64 the rows solve against
  the one-program solve;
- the tf32 defaults at the headline shapes (B = 64 and 1 at N = 64; B = 64 and 1 at N = 128) for comparison with
  run 63 (303.9, 21.2, 970.2, 44.0 us).

Run (GPU): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-03d/ab64.py
"""

import torch

from ab_verify import time_variants
from lumotree.optimized import gdn_tree as G

H, HV, K, V = 16, 32, 128, 128
dev = torch.device("cuda")
OLD_FUSED = G.KernelConfig(64, 32, 8, 2, False, tma=True)


def defaults(B, N, mode, dtype=torch.float32):
    return G.verify_config(B, HV, N, K, V, dev, H, mode, dtype), G.commit_config(B, HV, N, K, V, dev, mode)


for B, N in ((64, 64), (1, 64), (64, 128), (1, 128)):
    time_variants(B, N, "tf32", {"default": defaults(B, N, "tf32")}, rounds=3)
for B in (1, 64, 16):
    new, c = defaults(B, 128, "tf32x3")
    rows = new._replace(row_halves=True, solve_tma=False, solve_stages=2)
    table = {"default": (new, c), "rows, 4 warps": (rows._replace(solve_warps=4), c)}
    if not new.row_halves:
        table["rows, 8 warps"] = (rows._replace(solve_warps=8), c)
    time_variants(B, 128, "tf32x3", table, rounds=3)
for B in (1, 64):
    new, c = defaults(B, 128, "tf32", torch.bfloat16)
    old = OLD_FUSED if B == 1 else new._replace(solve_warps=8, solve_stages=3, solve_tma=True, row_halves=False)
    time_variants(B, 128, "tf32", {"new default": (new, c), "old default": (old, c)}, dtype=torch.bfloat16, rounds=3)
