"""Twenty-third session, run 51: N = 128, where 64 requests take 1090 us (11x fla's decode step; run 41). Each
kernel of the split pipeline alone (the solve, the apply, the commit) at B = 64 and 16, then same-run A / Bs of
the apply's and the solve's launch shapes at B = 64 (compile-only, Triton 3.6: the default solve 255 registers at 8
warps with 376 bytes of stack, the 128-column apply 255 at 8 warps: one program of each per SM). tf32, fp32 inputs.

Run (GPU): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-03b/ab51.py
"""

import torch

import gdn_profile as P
import gdn_tree as T
from ab_verify import time_variants
from lumotree.optimized import gdn_tree as G

H, HV, K, V, N = 16, 32, 128, 128, 128
dev = torch.device("cuda")
for B in (64, 16):
    x = T.make_inputs(B, N, "random", seed=B * 1000 + N)
    x["meta"] = G.tree_meta(x["parents"])
    _, factors = P._verify(x, "tf32")
    fns = {"verify": lambda: P._verify(x, "tf32"),
           "solve alone": P._without("_gdn_tree_apply_kernel", lambda: P._verify(x, "tf32")),
           "apply alone": P._without("_gdn_tree_solve_kernel", lambda: P._verify(x, "tf32")),
           "commit": lambda: G.gdn_tree_commit(x["pool"], x["slots"], factors, x["parents"], x["accepted"],
                                               input_precision="tf32", meta=x["meta"], validate=False)}
    times = {name: T.graph_time(fn, rep_ms=80)[0] for name, fn in fns.items()}
    print(f"B = {B}, N = {N}: " + ", ".join(f"{k} {v:.1f} us" for k, v in times.items()), flush=True)
    del x, factors

default = G.verify_config(64, HV, N, K, V, dev, H, "tf32")
commit = G.commit_config(64, HV, N, K, V, dev)
time_variants(64, N, "tf32", {
    "default (apply 128 columns, 8 warps; solve 8 warps)": (default, commit),
    "apply 64 columns, 8 warps": (default._replace(block_v=64), commit),
    "apply 64 columns, 4 warps": (default._replace(block_v=64, num_warps=4), commit),
    "apply 32 columns, 4 warps": (default._replace(block_v=32, num_warps=4), commit),
    "solve 16 warps": (default._replace(solve_warps=16), commit),
    "solve 16 warps, 2 stages": (default._replace(solve_warps=16, solve_stages=2), commit),
}, rounds=3)
