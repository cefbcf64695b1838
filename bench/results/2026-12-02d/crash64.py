"""Fifteenth session, run 2: which launch form faulted at B = 64, N = 64 in run 1 (an illegal address in the first
graph replay of the probe's timing loop: verify with launch_dependents + PDL commit, fp16 scratch, the pool left as
the previous replay committed it). One form per process (argv): verify + commit captured in a CUDA graph, replayed
300 times with a synchronisation after each, then the outputs checked against an eager run of the same form.

Forms: ``pdl`` (as the probe: signalling verify, PDL commit), ``pdl32`` (the same with fp32 scratch), ``plain`` (no
PDL between verify and commit), ``verify`` (the verify alone, signalling), ``reset`` (``pdl`` with the pool
restored before each verify, as crash128.py did).

Run (GPU): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-02d/crash64.py pdl
"""

import sys

import torch

import gdn_tree as T  # bench/gdn_tree.py
from lumotree.optimized import gdn_tree as G

form = sys.argv[1]
B = int(sys.argv[2]) if len(sys.argv) > 2 else 64
x = T.make_inputs(B, 64, "random", seed=B * 1000 + 64)
config = G.verify_config(B, 32, 64, 128, 128, torch.device("cuda"), 16, "tf32")
if form == "pdl32":
    config = config._replace(scratch16=False)
signal = form in ("pdl", "pdl32", "verify", "reset")
meta = G.tree_meta(x["parents"])
pool = x["pool"].clone()
pool0 = x["pool"].clone()


def step():
    if form == "reset":
        pool.copy_(pool0)
    o, f = G.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], pool, x["slots"], x["parents"],
                             use_qk_l2norm_in_kernel=True, input_precision="tf32", meta=meta, validate=False,
                             config=config, launch_dependents=signal)
    if form != "verify":
        G.gdn_tree_commit(pool, x["slots"], f, x["parents"], x["accepted"], input_precision="tf32", meta=meta,
                          validate=False, pdl=signal)
    return o


step()
torch.cuda.synchronize()
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    o = step()
done = 0
for i in range(300):
    g.replay()
    torch.cuda.synchronize()
    done += 1
print(f"B = {B} {form}: {done} replays clean, config {tuple(config)}, o finite: {bool(torch.isfinite(o).all())}, "
      f"pool finite: {bool(torch.isfinite(pool[x['slots'].long()]).all())}", flush=True)
