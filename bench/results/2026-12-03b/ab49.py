"""Twenty-third session, run 49: the paired split solve's two doublings in lockstep (``KernelConfig.solve_lockstep``:
each step's four products independent, the dependent chain L products long for both heads instead of 2 L) against
the default (one head's doubling after the other's), tf32, fp32 inputs: B = 64 and 16 at N = 64, B = 64 at N = 32.
Compile-only (Triton 3.6, sm_90): N = 64 255 registers, 0 -> 16 bytes of stack; N = 32 164 -> 166 registers.

Run (GPU), with lockstep_doubling.patch beside this file applied (measured neutral and not kept):
PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-03b/ab49.py
"""

import torch

from ab_verify import time_variants
from lumotree.optimized import gdn_tree as G

H, HV, K, V = 16, 32, 128, 128
dev = torch.device("cuda")
for B, N in ((64, 64), (16, 64), (64, 32)):
    default = G.verify_config(B, HV, N, K, V, dev, H, "tf32")
    commit = G.commit_config(B, HV, N, K, V, dev)
    time_variants(B, N, "tf32", {"default": (default, commit),
                                 "lockstep": (default._replace(solve_lockstep=True), commit)}, rounds=5)
