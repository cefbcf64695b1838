"""Twenty-fifth session, run 60: the new defaults at N = 128 (the solve by row halves: tf32 large batches 4 warps and
2 stages, small batches the split pipeline with an 8-warp rows solve instead of the fused kernel, ieee 8 warps)
against the old ones, same run, and tf32x3 at B = 1 (still the fused kernel) against a split rows pipeline.

Ran on ``row_halves.patch`` with these defaults in ``verify_config`` (not kept: in the GPU tests of the same run
the small-batch form faulted with an illegal address on gated trees of mixed sizes, ``probe61.py``): tf32 large
batches past N = 64 ``solve_warps=4, solve_stages=2, row_halves=True, solve_tma=False``; tf32 small batches past
N = 64 ``KernelConfig(64, 32, 8, 2, True, 8, solve_stages=2, apply_pdl=True, tma=True, halves=True,
row_halves=True)``; ieee past N = 64 ``KernelConfig(16, 32, 8, 2, True, 8, apply_pdl=True, halves=True,
row_halves=True)``.

Run (GPU): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-03c/ab60.py
"""

import torch

import gdn_tree as T
from ab_verify import time_variants
from lumotree.optimized import gdn_tree as G

H, HV, K, V, N = 16, 32, 128, 128, 128
dev = torch.device("cuda")
OLD_SMALL = G.KernelConfig(64, 32, 8, 2, False, tma=True)  # the fused kernel, before run 60
OLD_IEEE = G.KernelConfig(16, 32, 8, 2, True, 16, apply_pdl=True, solve_tma=True, halves=True)
SPLIT_ROWS = G.KernelConfig(64, 32, 8, 2, True, 8, solve_stages=2, apply_pdl=True, tma=True, halves=True,
                            row_halves=True)


def old_of(B, mode, new):
    if mode == "ieee":
        return OLD_IEEE
    if B * HV >= 2 * G._num_sms(dev):
        return new._replace(solve_warps=8, solve_stages=3, solve_tma=True, row_halves=False)
    return OLD_SMALL


for B, mode in ((64, "tf32"), (16, "tf32"), (8, "tf32"), (4, "tf32"), (1, "tf32"), (1, "tf32x3"), (1, "ieee"),
                (64, "ieee")):
    new = G.verify_config(B, HV, N, K, V, dev, H, mode)
    c = G.commit_config(B, HV, N, K, V, dev, mode)
    table = {"new default": (new, c), "old default": (old_of(B, mode, new), c)}
    if mode == "tf32x3":
        table = {"default (fused)": (new, c), "split rows": (SPLIT_ROWS, c)}
    print(f"B = {B} {mode}: {dict((k, tuple(v[0])) for k, v in table.items())}", flush=True)
    if B <= 16:
        x = T.make_inputs(B, N, "random", seed=B * 1000 + N)
        for name, (vcfg, _) in table.items():
            eo, es = T.errors(x, mode, min(B, 4), config=vcfg)
            print(f"B = {B} {mode} {name}: err o / state {eo:.2e} / {es:.2e}", flush=True)
        del x
    time_variants(B, N, mode, table, rounds=3)
