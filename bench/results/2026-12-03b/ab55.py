"""Twenty-third session, run 55: the N = 128 split solve's warps with the inverse by halves (compile-only, Triton
3.6: 8 warps 255 registers and 320 bytes of stack at 3 stages; 16 warps 128 registers and 256 bytes; before the
halves 16 warps lost, run 51: 1194.4 against 1005.2 us verify), tf32, B = 64.

Run (GPU): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-03b/ab55.py
"""

import torch

from ab_verify import time_variants
from lumotree.optimized import gdn_tree as G

H, HV, K, V, N = 16, 32, 128, 128, 128
dev = torch.device("cuda")
default = G.verify_config(64, HV, N, K, V, dev, H, "tf32")
commit = G.commit_config(64, HV, N, K, V, dev)
time_variants(64, N, "tf32", {"default (halves, 8 warps, 3 stages)": (default, commit),
                              "16 warps, 3 stages": (default._replace(solve_warps=16), commit),
                              "16 warps, 2 stages": (default._replace(solve_warps=16, solve_stages=2), commit)},
              rounds=3)
