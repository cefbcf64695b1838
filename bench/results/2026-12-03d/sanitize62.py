"""Twenty-sixth session, run 62: every default launch of the solve by row halves under compute-sanitizer's memcheck
(the run-61 fault was an out-of-range shared-memory read in its 8-warp form, gated trees of mixed sizes): tf32 and
tf32x3 small batches (8 warps), ieee (8 warps), tf32 large batches (4 warps); gated and ungated, trees of mixed
sizes (``num_nodes``) and full ones, fp32 and bf16 inputs; Qwen3-Next shapes. Prints each case's largest |o| (all
finite) and verify_config's choice.

Run (GPU): compute-sanitizer --tool memcheck python3 bench/results/2026-12-03d/sanitize62.py
"""

import sys

import numpy as np
import torch

sys.path.insert(0, "tests")
import test_gdn_kernels as T  # noqa: E402

from lumotree.optimized import gdn_tree as G  # noqa: E402

dev = torch.device("cuda")
CASES = [(6, "mixed", True, "tf32", torch.float32), (6, "mixed", False, "tf32", torch.float32),
         (6, "full", True, "tf32", torch.float32), (6, "mixed", True, "tf32", torch.bfloat16),
         (6, "mixed", True, "tf32x3", torch.float32), (6, "mixed", True, "ieee", torch.float32),
         (64, "mixed", True, "tf32", torch.float32), (64, "mixed", True, "ieee", torch.float32),
         (64, "mixed", False, "tf32", torch.bfloat16)]
for B, sizes, gated, precision, dtype in CASES:
    rng = np.random.default_rng(B)
    if B == 6 and sizes == "mixed":
        rows = T._gpu_rows(7)
    else:
        lens = rng.integers(1, 129, B).tolist() if sizes == "mixed" else [128] * B
        lens[0] = 128
        rows = [T.build_tree_parents("random", n, rng) for n in lens]
    case = T.make_case(rows, **T.QWEN, gated=gated, seed=11, dtype=dtype)
    if sizes == "full":
        case["num_nodes"] = None
    cfg = G.verify_config(B, 32, 128, 128, 128, dev, 16, precision, dtype)
    o, f = T.run_verify(case, l2norm=True, gated=gated, neg=gated, precision=precision)
    torch.cuda.synchronize()
    real = torch.cat([o[b, :len(r)] for b, r in enumerate(rows)])
    print(f"B={B} {sizes} gated={gated} {precision} {dtype}: row_halves={cfg.row_halves} "
          f"solve_warps={cfg.solve_warps} finite={bool(torch.isfinite(real).all())} "
          f"max|o|={float(real.float().abs().max()):.4f}", flush=True)
