"""Twentieth session, run 30: ieee mode at N = 128, where the default kernels compile to 32 registers and 9.7-16 KB of
stack (sm_90, compile-only): the default split config (solve 16 warps, 2 stages; apply 128 columns, 8 warps) against
the spill-free apply (16 columns, 8 warps, 2 stages: 79 registers, no stack) with the solve at 1 stage (64
registers, 5.8 KB), and for B = 1 the fused kernel's default against the fused variants given on the command line.
Verify + commit and verify alone (graphs, median of three interleaved rounds), every pool kept alive; ``diff``: the
outputs, factors and committed pool of one eager step against the default's.

Run (GPU): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-02i/ab_ieee128.py B [BV,BK,WARPS,STAGES ...]
"""

import sys

import numpy as np
import torch
import triton

import gdn_tree as T  # bench/gdn_tree.py
from lumotree.optimized import gdn_tree as G

B, N, ROUNDS = int(sys.argv[1]), 128, 3
dev = torch.device("cuda")
x = T.make_inputs(B, N, "random", seed=B * 1000 + N)
meta = G.tree_meta(x["parents"])
KC = G.KernelConfig
default = G.verify_config(B, 32, N, 128, 128, dev, 16, "ieee")
VARIANTS = {"default": default,
            "apply 16 cols 8 warps, solve 1 stage": KC(16, 32, 8, 2, True, 16, solve_stages=1, apply_pdl=True),
            "apply 16 cols 8 warps": KC(16, 32, 8, 2, True, 16, apply_pdl=True)}
for spec in sys.argv[2:]:
    bv, bk, nw, ns = (int(t) for t in spec.split(","))
    VARIANTS[f"fused {spec}"] = KC(bv, bk, nw, ns, False)
ccfg = G.commit_config(B, 32, N, 128, 128, dev, "ieee")


def verify(pool, cfg):
    return G.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], pool, x["slots"], x["parents"],
                             use_qk_l2norm_in_kernel=True, input_precision="ieee", meta=meta, validate=False,
                             config=cfg, launch_dependents=True)


def commit(pool, f):
    G.gdn_tree_commit(pool, x["slots"], f, x["parents"], x["accepted"], input_precision="ieee", meta=meta,
                      validate=False, pdl=True, config=ccfg)


keep, graphs, results = [], {}, {}
for name, cfg in VARIANTS.items():
    fresh = x["pool"].clone()
    o, f = verify(fresh, cfg)
    commit(fresh, f)
    torch.cuda.synchronize()
    results[name] = (o, f.delta, fresh)
    keep.append((fresh, o, f))
    diffs = [float((a - b).abs().max() / b.abs().max()) for a, b in zip(results[name], results["default"])]
    pool = x["pool"].clone()
    keep.append(pool)
    for what, fn in (("both", lambda pool=pool, cfg=cfg: commit(pool, verify(pool, cfg)[1])),
                     ("verify", lambda pool=pool, cfg=cfg: verify(pool, cfg))):
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        g.replay()
        torch.cuda.synchronize()
        graphs[(name, what)] = g
    print(f"B = {B} N = {N} ieee {name}: {cfg}, diff o / delta / state {diffs}", flush=True)
times = {k: [] for k in graphs}
for r in range(ROUNDS):
    for k, g in graphs.items():
        times[k].append(1e3 * triton.testing.do_bench(g.replay, warmup=3, rep=60, return_mode="median"))
        torch.cuda.synchronize()
print(f"\nB = {B}, N = {N}, random, fp32, ieee (median of {ROUNDS} rounds, us):\n"
      "| verify config | verify + commit | verify |\n|---|---|---|")
for name in VARIANTS:
    row = " | ".join(f"{np.median(times[(name, w)]):.1f}" for w in ("both", "verify"))
    print(f"| {name} | {row} |", flush=True)
