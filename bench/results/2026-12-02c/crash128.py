"""Fourteenth session, run 5: which launch form faulted at B = 1, N = 128 in run 4 (an illegal address while the
probe replayed its graphs). One form per process (argv: fused|split, pdl|plain): verify + commit captured in a CUDA
graph, replayed 300 times with a synchronisation after each, then checked against the eager plain launch.

Run (GPU): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-02c/crash128.py fused pdl
"""

import sys

import torch

import gdn_tree as T  # bench/gdn_tree.py
from lumotree.optimized import gdn_tree as G

form, launch = sys.argv[1], sys.argv[2]
x = T.make_inputs(1, 128, "random", seed=1128)
config = G.KernelConfig(64, 32, 8, 2, False) if form == "fused" else G.KernelConfig(
    32, 32, 4, 3, True, 4, solve_heads=1, solve_stages=3, apply_pdl=True)
pdl = launch == "pdl"
meta = G.tree_meta(x["parents"])
pool0 = x["pool"].clone()


def both():
    x["pool"].copy_(pool0)
    o, f = G.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], x["pool"], x["slots"], x["parents"],
                             use_qk_l2norm_in_kernel=True, input_precision="tf32", meta=meta, validate=False,
                             config=config, launch_dependents=pdl)
    G.gdn_tree_commit(x["pool"], x["slots"], f, x["parents"], x["accepted"], input_precision="tf32", meta=meta,
                      validate=False, pdl=pdl)
    return o


want = both().clone()
want_pool = x["pool"].clone()
g = torch.cuda.CUDAGraph()
both()
torch.cuda.synchronize()
with torch.cuda.graph(g):
    o = both()
for i in range(300):
    g.replay()
    torch.cuda.synchronize()
same = torch.equal(o, want) and torch.equal(x["pool"], want_pool)
print(f"{form} {launch}: 300 replays, same as eager: {same}", flush=True)
