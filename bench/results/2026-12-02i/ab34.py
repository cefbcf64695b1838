"""Twentieth session, run 34: B = 1, N = 64, tf32 (the 3x target's shape, no margin): the library's small-batch
split config against wider solve and apply programs (the GPU is nearly idle at B = 1: 32 solve programs, 128 apply
programs on 132 SMs). Verify + commit (the commit a PDL launch behind the verify, as the benchmark launches it) and
verify alone, median of five interleaved rounds, every pool and graph kept alive; ``diff`` against the default.

Run (GPU): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-02i/ab34.py
"""

import numpy as np
import torch
import triton

import gdn_tree as T  # bench/gdn_tree.py
from lumotree.optimized import gdn_tree as G

B, N, ROUNDS = 1, 64, 5
dev = torch.device("cuda")
x = T.make_inputs(B, N, "random", seed=B * 1000 + N)
meta = G.tree_meta(x["parents"])
default = G.verify_config(B, 32, N, 128, 128, dev, 16, "tf32")
VARIANTS = {"default": default, "solve 8 warps": default._replace(solve_warps=8),
            "solve 8 warps, 2 stages": default._replace(solve_warps=8, solve_stages=2),
            "apply 8 warps": default._replace(num_warps=8), "default again": default}
ccfg = G.commit_config(B, 32, N, 128, 128, dev, "tf32")


def verify(pool, cfg):
    return G.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], pool, x["slots"], x["parents"],
                             use_qk_l2norm_in_kernel=True, input_precision="tf32", meta=meta, validate=False,
                             config=cfg, launch_dependents=True)


def commit(pool, f):
    G.gdn_tree_commit(pool, x["slots"], f, x["parents"], x["accepted"], input_precision="tf32", meta=meta,
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
    print(f"B = {B} N = {N} tf32 {name}: diff o / delta / state {diffs}", flush=True)
times = {k: [] for k in graphs}
for r in range(ROUNDS):
    for k, g in graphs.items():
        times[k].append(1e3 * triton.testing.do_bench(g.replay, warmup=10, rep=100, return_mode="median"))
        torch.cuda.synchronize()
print(f"\nB = {B}, N = {N}, random, fp32, tf32 (median of {ROUNDS} rounds, us):\n"
      "| verify config | verify + commit | verify |\n|---|---|---|")
for name in VARIANTS:
    row = " | ".join(f"{np.median(times[(name, w)]):.1f}" for w in ("both", "verify"))
    print(f"| {name} | {row} |", flush=True)
