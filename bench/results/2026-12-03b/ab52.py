"""Twenty-third session, run 52: ``(I + A)^{-1}`` by its diagonal halves (``KernelConfig.halves``:
``[[T_11, 0], [-T_22 A_21 T_11, T_22]]``, each ``T_ii`` by doubling a ``[N/2, N/2]`` block: a quarter of the
doubling's products' work) against doubling the whole tile, in the default launch of each shape: the split solve at
B = 64 / 16, the fused kernel at B = 1 (and the split one at B = 1, N = 64), tf32 (and tf32x3 at N = 128), fp32
inputs. Run 51: at B = 64, N = 128 the solve alone takes 591.5 of the verify's 1002.6 us. Compile-only (Triton
3.6, sm_90): N = 128 solve 255 registers, 376 -> 472 bytes of stack, fused 1304 -> 1160; N = 64 paired solve 0 ->
224 bytes ([32, 32] products on mma.sync instead of wgmma); N = 32 no spills either way.

Run (GPU): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-03b/ab52.py
"""

import torch

from ab_verify import time_variants
from lumotree.optimized import gdn_tree as G

H, HV, K, V = 16, 32, 128, 128
dev = torch.device("cuda")
for B, N, precision in ((64, 128, "tf32"), (1, 128, "tf32"), (16, 128, "tf32"), (64, 128, "tf32x3"),
                        (64, 64, "tf32"), (1, 64, "tf32"), (64, 32, "tf32"), (1, 32, "tf32")):
    default = G.verify_config(B, HV, N, K, V, dev, H, precision)
    commit = G.commit_config(B, HV, N, K, V, dev, precision)
    time_variants(B, N, precision, {"whole tile": (default._replace(halves=False), commit),
                                    "halves": (default._replace(halves=True), commit)}, rounds=3)
