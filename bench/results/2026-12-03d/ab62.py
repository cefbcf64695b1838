"""Twenty-sixth session, run 62: the N = 128 defaults with the solve by row halves (its ``C = T_ll (-A_lu)`` now
through an fp32 workspace in L2, the fix of run 61's out-of-range shared read) against the defaults before it, same
run: tf32 large batches (4-warp 2-stage rows solve against one 8-warp 3-stage program per value head), tf32 and
tf32x3 small batches (the split pipeline with an 8-warp rows solve against the fused kernel), ieee (8-warp rows
solve against the 16-warp one-program solve).

Run (GPU): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-03d/ab62.py
"""

import torch

import gdn_tree as T
from ab_verify import time_variants
from lumotree.optimized import gdn_tree as G

H, HV, K, V, N = 16, 32, 128, 128, 128
dev = torch.device("cuda")
OLD_SMALL = G.KernelConfig(64, 32, 8, 2, False, tma=True)  # the fused kernel, before run 60
OLD_IEEE = G.KernelConfig(16, 32, 8, 2, True, 16, apply_pdl=True, solve_tma=True, halves=True)


def old_of(B, mode, new):
    if mode == "ieee":
        return OLD_IEEE
    if B * HV >= 2 * G._num_sms(dev):
        return new._replace(solve_warps=8, solve_stages=3, solve_tma=True, row_halves=False)
    assert new.row_halves and new.split
    return OLD_SMALL


for B, mode in ((64, "tf32"), (16, "tf32"), (8, "tf32"), (4, "tf32"), (1, "tf32"), (1, "tf32x3"), (1, "ieee"),
                (64, "ieee")):
    new = G.verify_config(B, HV, N, K, V, dev, H, mode)
    c = G.commit_config(B, HV, N, K, V, dev, mode)
    table = {"new default": (new, c), "old default": (old_of(B, mode, new), c)}
    print(f"B = {B} {mode}: {dict((k, tuple(v[0])) for k, v in table.items())}", flush=True)
    if B <= 16:
        x = T.make_inputs(B, N, "random", seed=B * 1000 + N)
        for name, (vcfg, _) in table.items():
            eo, es = T.errors(x, mode, min(B, 4), config=vcfg)
            print(f"B = {B} {mode} {name}: err o / state {eo:.2e} / {es:.2e}", flush=True)
        del x
    time_variants(B, N, mode, table, rounds=3)
