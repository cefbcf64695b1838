"""Same-run A / B of GDN tree verify + commit launch configs (the harness of the session probes under
``bench/results/``): one layer at Qwen3-Next shapes, random trees, each variant's verify + commit (the commit a PDL
launch behind the verify, as ``bench/gdn_tree.py`` launches it) and verify alone captured in CUDA graphs, every pool
and graph kept alive, timed in interleaved rounds (median of ``triton.testing.do_bench`` medians). ``diff``: max
|difference| / max |first variant| of o, delta and the committed state, printed per variant before the timing.

Use: ``from ab_verify import time_variants`` with ``bench/`` on ``sys.path``; GPU only.
"""

from __future__ import annotations

import numpy as np
import torch
import triton

import gdn_tree as T  # bench/gdn_tree.py
from lumotree.optimized import gdn_tree as G


def time_variants(B: int, N: int, precision: str, table: dict, dtype: torch.dtype = torch.float32,
                  rounds: int = 5) -> dict:
    """Time every ``name: (verify config, commit config)`` of ``table`` at (B, N) and print a markdown table of
    verify + commit and verify alone (µs); returns ``{name: (both_us, verify_us)}``."""
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
    first = next(iter(table))
    tag = f"B = {B} N = {N} {precision}" + ("" if dtype == torch.float32 else f" {dtype}")
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
        print(f"{tag} {name}: diff o / delta / state {diffs}", flush=True)
    times = {k: [] for k in graphs}
    for _ in range(rounds):
        for k, g in graphs.items():
            times[k].append(1e3 * triton.testing.do_bench(g.replay, warmup=10, rep=100, return_mode="median"))
            torch.cuda.synchronize()
    print(f"\nB = {B}, N = {N}, random, {'fp32' if dtype == torch.float32 else dtype}, {precision} (median of "
          f"{rounds} rounds, us):\n| variant | verify + commit | verify |\n|---|---|---|")
    out = {}
    for name in table:
        out[name] = tuple(float(np.median(times[(name, w)])) for w in ("both", "verify"))
        print(f"| {name} | {out[name][0]:.1f} | {out[name][1]:.1f} |", flush=True)
    del graphs, keep
    return out
