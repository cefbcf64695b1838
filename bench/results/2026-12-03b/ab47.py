"""Twenty-third session, run 47: the fused kernel (the solve once per 64 or 128 value columns, no scratch round
trip) with its tiles through tensor descriptors, against the split pipeline's default, at B = 64 and 16, N = 64,
tf32, fp32 inputs. Last timed at B = 64 on 2026-11-29 (run 1: 345 us at BV 64, 4 warps, before the descriptors).

Run (GPU): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-03b/ab47.py
"""

import torch

from ab_verify import time_variants
from lumotree.optimized import gdn_tree as G

H, HV, K, V = 16, 32, 128, 128
dev = torch.device("cuda")
KC = G.KernelConfig
for B in (64, 16):
    commit = G.commit_config(B, HV, 64, K, V, dev)
    time_variants(B, 64, "tf32", {
        "default (split)": (G.verify_config(B, HV, 64, K, V, dev, H, "tf32"), commit),
        "fused bv64 w4 tma": (KC(64, 32, 4, 3, split=False, tma=True), commit),
        "fused bv64 w8 tma": (KC(64, 32, 8, 3, split=False, tma=True), commit),
        "fused bv128 w8 tma": (KC(128, 32, 8, 2, split=False, tma=True), commit),
    }, rounds=3)
