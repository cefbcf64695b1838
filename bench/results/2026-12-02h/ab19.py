"""Nineteenth session, run 19: loads moved ahead of the waits they do not depend on, against HEAD's kernels
(``old``, the module source given as argv[2]), behind the library's configs (fp32 inputs, tf32, random trees, N =
64): the one-head solve (``KernelConfig.solve_heads == 1``, the small batches) reads its gates, ``log Gamma`` and
the tree's depth before its K loop (``GATES_FIRST``; the paired solve of large batches reads the depth once for
both heads), and the PDL commit finds the accepted node's path before its wait.

Verify + commit, verify alone and commit alone (a graph of the commit only, each replay on the same committed
pool), median of five interleaved rounds of do_bench medians; every pool kept alive with its graphs. ``diff``: the
outputs and the committed pool of one eager verify + commit on a fresh clone against the old kernels' (0 expected:
the same products on the same operands).

Run (GPU): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-02h/ab19.py 1 /tmp/old_gdn_tree.py
(argv[3] ``isolate``, run 20: also the library with the one-head solve's ``GATES_FIRST`` off, in a copy;
``caps``, run 22: also the solve capped at 168 and 128 registers, in copies; ``AB_N``: the node count, 64).
"""

import importlib.util
import os
import sys

import numpy as np
import torch
import triton

import gdn_tree as T  # bench/gdn_tree.py
from lumotree.optimized import gdn_tree as G


def load_module(name: str, path: str):
    spec = importlib.util.spec_from_file_location(f"lumotree.optimized.{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


B = int(sys.argv[1])
ROUNDS = 5
old = load_module("ab19_old", sys.argv[2])
N = int(os.environ.get("AB_N", "64"))  # run 21: also N = 128 and 32
x = T.make_inputs(B, N, "random", seed=B * 1000 + N)
dev = torch.device("cuda")
VARIANTS = {"old": old, "new": G, "old_again": old, "new_again": G}
if len(sys.argv) > 3 and sys.argv[3] == "isolate":  # run 20: the one-head solve's GATES_FIRST off in a copy
    src = open(G.__file__).read()
    rule = "GATES_FIRST=cfg.solve_heads == 1"
    assert src.count(rule) == 1
    with open("/tmp/ab19_no_gates_first.py", "w") as fh:
        fh.write(src.replace(rule, "GATES_FIRST=False"))
    VARIANTS["new_no_gates_first"] = load_module("ab19_no_gates_first", "/tmp/ab19_no_gates_first.py")
if len(sys.argv) > 3 and sys.argv[3] == "caps":  # run 22: the solve capped at 168 (3 programs per SM) and 128 (4)
    src = open(G.__file__).read()
    rule = "num_stages=cfg.solve_stages or cfg.num_stages, PDL=apply_pdl,"
    assert src.count(rule) == 1
    for cap in (168, 128):
        with open(f"/tmp/ab19_solve_cap{cap}.py", "w") as fh:
            fh.write(src.replace(rule, f"maxnreg={cap}, " + rule))
        VARIANTS[f"solve_cap{cap}"] = load_module(f"ab19_solve_cap{cap}", f"/tmp/ab19_solve_cap{cap}.py")
meta = G.tree_meta(x["parents"])


def configs(mod):
    return (mod.verify_config(B, 32, N, 128, 128, dev, 16, "tf32"), mod.commit_config(B, 32, N, 128, 128, dev, "tf32"))


def verify(pool, mod):
    return mod.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], pool, x["slots"], x["parents"],
                               use_qk_l2norm_in_kernel=True, input_precision="tf32", meta=meta, validate=False,
                               config=configs(mod)[0], launch_dependents=True)


def commit(pool, f, mod):
    mod.gdn_tree_commit(pool, x["slots"], f, x["parents"], x["accepted"], input_precision="tf32", meta=meta,
                        validate=False, pdl=True, config=configs(mod)[1])


keep, graphs, results = [], {}, {}
for name, mod in VARIANTS.items():
    fresh = x["pool"].clone()
    o, f = verify(fresh, mod)
    commit(fresh, f, mod)
    torch.cuda.synchronize()
    results[name] = (o, f.delta, fresh)
    keep.append((fresh, o, f))
    pool = x["pool"].clone()
    o, f = verify(pool, mod)
    keep.append((pool, o, f))
    for what, fn in (("both", lambda pool=pool, mod=mod: commit(pool, verify(pool, mod)[1], mod)),
                     ("verify", lambda pool=pool, mod=mod: verify(pool, mod)),
                     ("commit", lambda pool=pool, f=f, mod=mod: commit(pool, f, mod))):
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        g.replay()
        torch.cuda.synchronize()
        graphs[(name, what)] = g
    diffs = [float((a - b).abs().max() / b.abs().max()) for a, b in zip(results[name], results["old"])]
    print(f"B = {B} {name}: configs {configs(mod)}, diff o / delta / state {diffs}", flush=True)
times = {k: [] for k in graphs}
for r in range(ROUNDS):
    for k, g in graphs.items():
        times[k].append(1e3 * triton.testing.do_bench(g.replay, warmup=10, rep=100, return_mode="median"))
        torch.cuda.synchronize()
print(f"\nB = {B}, N = {N}, random, fp32, tf32 (median of {ROUNDS} rounds, us):\n"
      "| variant | verify + commit | verify | commit |\n|---|---|---|---|")
for name in VARIANTS:
    row = " | ".join(f"{np.median(times[(name, w)]):.1f}" for w in ("both", "verify", "commit"))
    print(f"| {name} | {row} |", flush=True)
