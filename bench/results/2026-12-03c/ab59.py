"""Twenty-fifth session, run 59: the split solve by row halves (``KernelConfig.row_halves``,
``_gdn_tree_solve_rows_kernel``: two programs per (request, value head), the lower half's waiting for the upper
half's diagonal block) against the one-program solve by halves, N = 128 (and N = 64 at B = 64). Compile-only
(Triton 3.6, sm_90, tf32, N = 128): the one-program solve 255 registers and 472 bytes of stack at 8 warps (one
program per SM); by row halves 223-229 registers and no stack at 8 warps, 128 and 272-296 bytes at a 128 cap (two
per SM).

Needs ``row_halves.patch`` (beside this file; not in the library: one GPU test faulted in run 60):
``git apply bench/results/2026-12-03c/row_halves.patch``.

Run (GPU): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-03c/ab59.py
"""

import torch

import gdn_tree as T
from ab_verify import time_variants
from lumotree.optimized import gdn_tree as G

H, HV, K, V = 16, 32, 128, 128
dev = torch.device("cuda")


def table(B, N, mode):
    d = G.verify_config(B, HV, N, K, V, dev, H, mode)
    c = G.commit_config(B, HV, N, K, V, dev, mode)
    rows = d._replace(row_halves=True, solve_heads=1, split=True, apply_pdl=True)
    if not d.split:  # small batches: the large-batch split pipeline's apply
        rows = G.verify_config(64, HV, N, K, V, dev, H, mode)._replace(row_halves=True, block_v=64)
    out = {"default": (d, c)}
    if N == 64:  # [32, 32] tiles (mma, not wgmma): 187 registers at 4 warps, 128 and 16 bytes of stack capped
        out.update({"rows, 4 warps, 3 stages": (rows._replace(solve_warps=4, solve_stages=3), c),
                    "rows, 4 warps, 3 stages, cap 128": (rows._replace(solve_warps=4, solve_stages=3,
                                                                       solve_max_registers=128), c)})
    elif mode == "ieee":
        out.update({"rows, 8 warps": (rows._replace(solve_warps=8), c),
                    "rows, 16 warps": (rows._replace(solve_warps=16), c)})
    elif B == 1:
        out.update({"split rows, 8 warps, 64 columns": (rows._replace(solve_warps=8, solve_stages=2), c),
                    "split rows, 4 warps": (rows._replace(solve_warps=4, solve_stages=2), c)})
    else:
        out.update({"rows, 8 warps, 3 stages": (rows._replace(solve_warps=8, solve_stages=3), c),
                    "rows, 8 warps, 2 stages": (rows._replace(solve_warps=8, solve_stages=2), c),
                    "rows, 8 warps, 2 stages, cap 128": (rows._replace(solve_warps=8, solve_stages=2,
                                                                       solve_max_registers=128), c),
                    "rows, 8 warps, 3 stages, cap 128": (rows._replace(solve_warps=8, solve_stages=3,
                                                                       solve_max_registers=128), c),
                    "rows, 4 warps, 2 stages": (rows._replace(solve_warps=4, solve_stages=2), c)})
    return out


for B, N, mode in ((64, 128, "tf32"), (16, 128, "tf32"), (64, 64, "tf32"), (1, 128, "tf32"), (64, 128, "ieee")):
    t = table(B, N, mode)
    x = T.make_inputs(B, N, "random", seed=B * 1000 + N)
    for name, (vcfg, _) in t.items():
        eo, es = T.errors(x, mode, min(B, 4), config=vcfg)
        print(f"B = {B} {mode} {name}: err o / state {eo:.2e} / {es:.2e}", flush=True)
    del x
    time_variants(B, N, mode, t, rounds=3)
