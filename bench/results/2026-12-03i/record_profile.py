"""Thirty-fourth session (prepared for run 110): the record kernel of the B = 64 step under Nsight Compute, at 2 warps
uncapped (the library) and at 4 warps with 64 registers (run 108's fastest), three steps each after a warm-up (the
profiler is pointed at ``_record_kernel`` by ``run110.sh``): where its ~15 µs go (latency chain, occupancy, spills).

Run (GPU): ``PYTHONPATH=$PWD:$PWD/bench python bench/results/2026-12-03i/record_profile.py``
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import gdn_fused as BF  # noqa: E402
import gdn_tree as bench_gdn  # noqa: E402

from lumotree.optimized import gdn_tree_pending as PD  # noqa: E402


def main():
    x = bench_gdn.make_inputs(64, 64, "random", 0)
    for warps, cap in ((2, None), (4, 64)):
        PD.RECORD_WARPS, PD.RECORD_MAX_REGISTERS = warps, cap
        step, _, _, _, _, _ = BF.fused_fns(x)
        for _ in range(4):
            step()
        torch.cuda.synchronize()
        print(f"record at {warps} warps, cap {cap}: 4 steps run", flush=True)


if __name__ == "__main__":
    main()
