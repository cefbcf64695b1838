"""Every default launch of the GDN tree kernels under compute-sanitizer's memcheck (a GPU check, not a timing).

verify (``verify_config``'s choice) then commit (``commit_config``'s) at Qwen3-Next shapes (H=16, HV=32, K=V=128)
for N in 16, 32, 64, 128, B in 1, 64, each precision mode, gated and ungated, fp32 and (tf32) bf16 inputs, trees
of mixed sizes with junk in the padding (``tests/test_gdn_kernels.make_case``). The value tests cannot see a read
past a kernel's allocation that lands in the padding or in a replicated row; memcheck does (run 61 found one this
way, in the 8-warp solve by row halves). Prints each case's config and whether its outputs are finite; the verdict
is memcheck's ``ERROR SUMMARY``.

Run (GPU): ``compute-sanitizer --tool memcheck python3 bench/sanitize_gdn.py [--nodes 64 128] [--batches 1 64]``
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import test_gdn_kernels as T  # noqa: E402 - the tests' case builder (mixed sizes, junk padding)

from lumotree.optimized import gdn_tree as G  # noqa: E402


def cases(nodes, batches):
    """(B, N, precision, gated, dtype): every mode at every shape, gates alternating, bf16 inputs in tf32 mode."""
    for N in nodes:
        for B in batches:
            for i, precision in enumerate(G.PRECISIONS):
                yield B, N, precision, (i + N // 16) % 2 == 0, torch.float32
            yield B, N, "tf32", N % 32 == 0, torch.bfloat16


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", nargs="+", type=int, default=[16, 32, 64, 128])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 64])
    args = parser.parse_args()
    dev = torch.device("cuda")
    for B, N, precision, gated, dtype in cases(args.nodes, args.batches):
        rng = np.random.default_rng(B * 1000 + N)
        sizes = rng.integers(1, N + 1, B).tolist()
        sizes[0] = N
        rows = [T.build_tree_parents("random", n, rng) for n in sizes]
        case = T.make_case(rows, **T.QWEN, gated=gated, seed=N, dtype=dtype)
        HV = T.QWEN["H"] * T.QWEN["group"]
        cfg = G.verify_config(B, HV, N, T.QWEN["K"], T.QWEN["V"], dev, T.QWEN["H"], precision, dtype)
        o, factors = T.run_verify(case, l2norm=True, gated=gated, neg=gated, precision=precision)
        accepted = torch.tensor([int(rng.integers(0, n)) for n in sizes], dtype=torch.int32, device=dev)
        G.gdn_tree_commit(case["pool"], case["slots"], factors, case["parents"], accepted,
                          num_nodes=case["num_nodes"], input_precision=precision)
        torch.cuda.synchronize()
        real = torch.cat([o[b, :n] for b, n in enumerate(sizes)])
        finite = bool(torch.isfinite(real).all() and torch.isfinite(case["pool"][case["slots"]]).all())
        print(f"B={B:3d} N={N:3d} {precision:6s} gated={gated!s:5s} {str(dtype)[6:]:8s} split={cfg.split!s:5s} "
              f"row_halves={cfg.row_halves!s:5s} finite={finite}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
