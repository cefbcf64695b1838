"""Twentieth session, run 33: ieee at N = 128, the solve's doubling products streamed from scratch in K chunks of 16
(``_inverse_unit_lower_streamed``; compile-only 128 registers and 448 bytes of stack at 16 warps, against 32
registers and 9.7 KB) against the library before it (``old``: the module source given as argv[2]), both with the
library's default configs. Verify + commit and verify alone (graphs, median of three interleaved rounds), every
pool kept alive; ``diff``: outputs, factors and the committed pool of one eager step against the old kernels'.

Run (GPU): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-02i/ab33.py B /tmp/old_gdn_tree.py
"""

import importlib.util
import sys

import numpy as np
import torch
import triton

import gdn_tree as T  # bench/gdn_tree.py
from lumotree.optimized import gdn_tree as G

spec = importlib.util.spec_from_file_location("lumotree.optimized.ab33_old", sys.argv[2])
old = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = old
spec.loader.exec_module(old)
B, N, ROUNDS = int(sys.argv[1]), 128, 3
dev = torch.device("cuda")
x = T.make_inputs(B, N, "random", seed=B * 1000 + N)
meta = G.tree_meta(x["parents"])
VARIANTS = {"old": old, "new": G}


def verify(pool, mod):
    return mod.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], pool, x["slots"], x["parents"],
                               use_qk_l2norm_in_kernel=True, input_precision="ieee", meta=meta, validate=False,
                               config=mod.verify_config(B, 32, N, 128, 128, dev, 16, "ieee"), launch_dependents=True)


def commit(pool, f, mod):
    mod.gdn_tree_commit(pool, x["slots"], f, x["parents"], x["accepted"], input_precision="ieee", meta=meta,
                        validate=False, pdl=True, config=mod.commit_config(B, 32, N, 128, 128, dev, "ieee"))


keep, graphs, results = [], {}, {}
for name, mod in VARIANTS.items():
    fresh = x["pool"].clone()
    o, f = verify(fresh, mod)
    commit(fresh, f, mod)
    torch.cuda.synchronize()
    results[name] = (o, f.delta, fresh)
    keep.append((fresh, o, f))
    diffs = [float((a - b).abs().max() / b.abs().max()) for a, b in zip(results[name], results["old"])]
    pool = x["pool"].clone()
    keep.append(pool)
    for what, fn in (("both", lambda pool=pool, mod=mod: commit(pool, verify(pool, mod)[1], mod)),
                     ("verify", lambda pool=pool, mod=mod: verify(pool, mod))):
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        g.replay()
        torch.cuda.synchronize()
        graphs[(name, what)] = g
    print(f"B = {B} N = {N} ieee {name}: diff o / delta / state {diffs}", flush=True)
times = {k: [] for k in graphs}
for r in range(ROUNDS):
    for k, g in graphs.items():
        times[k].append(1e3 * triton.testing.do_bench(g.replay, warmup=3, rep=60, return_mode="median"))
        torch.cuda.synchronize()
print(f"\nB = {B}, N = {N}, random, fp32, ieee (median of {ROUNDS} rounds, us):\n"
      "| kernels | verify + commit | verify |\n|---|---|---|")
for name in VARIANTS:
    row = " | ".join(f"{np.median(times[(name, w)]):.1f}" for w in ("both", "verify"))
    print(f"| {name} | {row} |", flush=True)
