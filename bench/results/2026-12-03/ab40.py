"""Twenty-second session, run 40: the fused kernel's tiles (q, k, v, the state, o, delta) through tensor descriptors
(``KernelConfig.tma`` on a fused config) against its per-thread pointer loads, where the library launches the fused
kernel (small batches at N != 64, ``ieee`` at N = 64), random trees, fp32 and bf16 inputs.
Verify + commit (the commit a PDL launch behind the verify, as the benchmark launches it) and verify alone, median
of five interleaved rounds, every pool and graph kept alive; ``diff``: max |difference| / max |default| of o, delta
and the committed state against the library's default configs.

Run (GPU): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-03/ab40.py
"""

import numpy as np
import torch
import triton

import gdn_tree as T  # bench/gdn_tree.py
from lumotree.optimized import gdn_tree as G

ROUNDS = 5
dev = torch.device("cuda")


def variants(B, N, precision):
    vcfg = G.verify_config(B, 32, N, 128, 128, dev, 16, precision)
    ccfg = G.commit_config(B, 32, N, 128, 128, dev, precision)
    assert not vcfg.split, (B, N, precision)
    out = {"library": (vcfg, ccfg), "fused tma": (vcfg._replace(tma=True), ccfg)}
    if vcfg.block_k != 32:
        out["fused tma, 32-row K, 3 stages"] = (vcfg._replace(tma=True, block_k=32, num_stages=3), ccfg)
    if vcfg.num_stages != 2:
        out["fused tma, 2 stages"] = (vcfg._replace(tma=True, num_stages=2), ccfg)
    out["default again"] = (vcfg, ccfg)
    return out


def run(B, N, precision, dtype=torch.float32):
    x = T.make_inputs(B, N, "random", seed=B * 1000 + N, dtype=dtype)
    meta = G.tree_meta(x["parents"])

    def verify(pool, cfg):
        return G.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], pool, x["slots"], x["parents"],
                                 use_qk_l2norm_in_kernel=True, input_precision=precision, meta=meta,
                                 validate=False, config=cfg, launch_dependents=True)

    def commit(pool, f, cfg):
        G.gdn_tree_commit(pool, x["slots"], f, x["parents"], x["accepted"], input_precision=precision, meta=meta,
                          validate=False, pdl=True, config=cfg)

    keep, graphs, results = [], {}, {}
    table = variants(B, N, precision)
    first = next(iter(table))
    for name, (vcfg, ccfg) in table.items():
        fresh = x["pool"].clone()
        o, f = verify(fresh, vcfg)
        commit(fresh, f, ccfg)
        torch.cuda.synchronize()
        results[name] = (o.float(), f.delta, fresh[x["slots"].long()])
        keep.append((fresh, o, f))
        diffs = [float((a - b).abs().max() / b.abs().max()) for a, b in zip(results[name], results[first])]
        pool = x["pool"].clone()
        keep.append(pool)
        for what, fn in (("both", lambda pool=pool, v=vcfg, c=ccfg: commit(pool, verify(pool, v)[1], c)),
                         ("verify", lambda pool=pool, v=vcfg: verify(pool, v))):
            fn()
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            g.replay()
            torch.cuda.synchronize()
            graphs[(name, what)] = g
        print(f"B = {B} N = {N} {precision} {dtype} {name}: diff o / delta / state {diffs}", flush=True)
    times = {k: [] for k in graphs}
    for _ in range(ROUNDS):
        for k, g in graphs.items():
            times[k].append(1e3 * triton.testing.do_bench(g.replay, warmup=10, rep=100, return_mode="median"))
            torch.cuda.synchronize()
    print(f"\nB = {B}, N = {N}, random, {dtype}, {precision} (median of {ROUNDS} rounds, us):\n"
          "| variant | verify + commit | verify |\n|---|---|---|")
    for name in table:
        row = " | ".join(f"{np.median(times[(name, w)]):.1f}" for w in ("both", "verify"))
        print(f"| {name} | {row} |", flush=True)
    del graphs, keep


for case in ((1, 32, "tf32"), (1, 8, "tf32"), (1, 128, "tf32"), (1, 32, "tf32", torch.bfloat16),
             (1, 64, "ieee"), (1, 32, "ieee"), (8, 32, "tf32"), (4, 128, "tf32"), (1, 128, "tf32x3")):
    run(*case)
