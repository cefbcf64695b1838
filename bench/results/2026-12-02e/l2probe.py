"""Sixteenth session, run 9: is the large-batch apply bound by its L2 traffic? The apply reads q and k in fp32 once
per V block and value head (8 times per q / k head at BV = 32, GVA 2): 64 of its ~120 KiB per program. Timed: the
library's verify and verify + commit at B = 64, N = 64 with fp32 against bf16 inputs (the same values rounded; bf16
halves the q / k / v bytes, an upper bound on what a 16-bit hand-over of q / k could save), CUDA-graph replay,
medians of three interleaved rounds, each form's outputs checked against the float64 closed form. ``--ncu``: three
eager fp32 verifies for Nsight Compute (the apply's L2 / DRAM throughput).

Run (GPU): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-02e/l2probe.py [--ncu]
"""

import sys

import numpy as np
import torch
import triton

import gdn_tree as T  # bench/gdn_tree.py
from lumotree.optimized import gdn_tree as G

B = 64
inputs = {dtype: T.make_inputs(B, 64, "random", seed=B * 1000 + 64, dtype=dtype)
          for dtype in (torch.float32, torch.bfloat16)}
keep = []


def forms(x):
    pool = x["pool"].clone()
    keep.append(pool)  # alive as long as the graphs

    def verify(signal=False):
        return G.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], pool, x["slots"], x["parents"],
                                 use_qk_l2norm_in_kernel=True, input_precision="tf32", validate=False,
                                 launch_dependents=signal)

    def both():
        _, f = verify(signal=True)
        G.gdn_tree_commit(pool, x["slots"], f, x["parents"], x["accepted"], input_precision="tf32", validate=False,
                          pdl=True)

    return {"verify": verify, "both": both}


if "--ncu" in sys.argv:
    verify = forms(inputs[torch.float32])["verify"]
    for _ in range(3):
        verify()
    torch.cuda.synchronize()
    raise SystemExit(0)
graphs = {}
for dtype, x in inputs.items():
    err_o, err_s = T.errors(x, "tf32", 2)
    print(f"{dtype}: err o {err_o:.2e} S {err_s:.2e}", flush=True)
    for what, fn in forms(x).items():
        keep.append(fn())
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            keep.append(fn())
        g.replay()
        torch.cuda.synchronize()
        graphs[(str(dtype)[6:], what)] = g
times = {k: [] for k in graphs}
for _ in range(3):
    for k, g in graphs.items():
        times[k].append(1e3 * triton.testing.do_bench(g.replay, warmup=10, rep=100, return_mode="median"))
print(f"\nB = {B}, N = 64, random, tf32, library defaults (median of 3 rounds, us):")
print("| inputs | verify | verify + commit |")
print("|---|---|---|")
for dtype in ("float32", "bfloat16"):
    print(f"| {dtype} | {np.median(times[(dtype, 'verify')]):.1f} | {np.median(times[(dtype, 'both')]):.1f} |")
