"""Twenty-third session, run 53: the inverse by halves (``KernelConfig.halves``) in ``ieee`` at N = 128, where it
replaces the split solve's doubling streamed from scratch (``STREAM``; B = 64 5.8 ms, run 38), at 16 and 8 solve
warps (compile-only, Triton 3.6: 128 registers and 400 bytes of stack at 16 warps against the streamed form's 264);
then each mode's error against float64 (outputs / committed state, relative L2, two requests) with and without
halves at B = 64, N = 128 (``bench/gdn_tree.py``'s ``errors``).

Run (GPU): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-03b/ab53.py (the streamed doubling, the ieee
default when this ran, was removed after it: check out 4252af1 with ab52's ``halves`` added to time it again)
"""

import torch

import gdn_tree as T
from ab_verify import time_variants
from lumotree.optimized import gdn_tree as G

H, HV, K, V, N = 16, 32, 128, 128, 128
dev = torch.device("cuda")
for B in (64, 1):
    default = G.verify_config(B, HV, N, K, V, dev, H, "ieee")
    commit = G.commit_config(B, HV, N, K, V, dev, "ieee")
    time_variants(B, N, "ieee", {"streamed (default)": (default, commit),
                                 "halves, 16 warps": (default._replace(halves=True), commit),
                                 "halves, 8 warps": (default._replace(halves=True, solve_warps=8), commit)}, rounds=3)
x = T.make_inputs(64, N, "random", seed=64 * 1000 + N)
for mode in ("tf32", "tf32x3", "ieee"):
    cfg = G.verify_config(64, HV, N, K, V, dev, H, mode)
    for halves in (False, True):
        err_o, err_s = T.errors(x, mode, 2, config=cfg._replace(halves=halves))
        print(f"errors {mode} halves={halves}: o {err_o:.2e} state {err_s:.2e}", flush=True)
