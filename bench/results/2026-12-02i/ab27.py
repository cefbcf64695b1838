"""Twentieth session, run 27: the commit's path terms as fp32 outer products on the CUDA cores
(``KernelConfig.rank_one``: no shared-memory staging, no ``wgmma``; compile-only at B = 64's ``[128, 64]`` tile and
4 warps 128 registers without a cap and without spills, against 166 uncapped / 128 with 8 bytes of stack for the
``tl.dot`` form) against the library's commit, behind the library's verify (fp32 inputs, tf32, N = 64).

Commit tilings: the library's default (``tl.dot``), and rank-one at several tiles and warps; ``RANK_ONE_BLOCK`` (path
nodes whose loads are in flight together) 4 (the module's) and 2 / 8 (module copies). Verify + commit (the commit a
PDL launch behind the verify, as the benchmark launches it) and the commit alone (a graph of the commit only, each
replay on the same committed pool), median of five interleaved rounds of do_bench medians; every pool and graph
kept alive. ``err``: the committed states of one eager verify + commit against ``gdn_tree_commit_ref`` in float64
on the same factors (the commit's own arithmetic), max abs / max abs.

Run (GPU): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-02i/ab27.py B KIND  (KIND: random or chain)
(run 31: ``AB_PRECISION=ieee``: the library's ieee commit, a ``tl.dot`` on the CUDA cores, against the rank-one form,
which is fp32 FMA arithmetic as well)
"""

import importlib.util
import os
import sys

import numpy as np
import torch
import triton

import gdn_tree as T  # bench/gdn_tree.py
from lumotree.optimized import gdn_tree as G
from lumotree.optimized import gdn_tree_ref as R


def load_copy(name: str, rule: str, replacement: str):
    src = open(G.__file__).read()
    assert src.count(rule) == 1, rule
    path = f"/tmp/{name}.py"
    with open(path, "w") as fh:
        fh.write(src.replace(rule, replacement))
    spec = importlib.util.spec_from_file_location(f"lumotree.optimized.{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


B = int(sys.argv[1])
KIND = sys.argv[2] if len(sys.argv) > 2 else "random"
N, ROUNDS = 64, 5
PREC = os.environ.get("AB_PRECISION", "tf32")
dev = torch.device("cuda")
x = T.make_inputs(B, N, KIND, seed=B * 1000 + N)
meta = G.tree_meta(x["parents"])
KC = G.KernelConfig
rule = "RANK_ONE_BLOCK = 4 "
pb2 = load_copy("ab27_pb2", rule, "RANK_ONE_BLOCK = 2 ")
pb8 = load_copy("ab27_pb8", rule, "RANK_ONE_BLOCK = 8 ")
default = G.commit_config(B, 32, N, 128, 128, dev, PREC)._replace(rank_one=False)
if PREC == "ieee":
    VARIANTS = {
        "dot (library)": (G, default),
        "r1 64x128 w4" if B >= 16 else "r1 32x32 w2":
            (G, KC(64, 128, 4, 1, rank_one=True) if B >= 16 else KC(32, 32, 2, 1, rank_one=True)),
        "dot (library) again": (G, default),
    }
elif B >= 16:
    VARIANTS = {
        "dot (library)": (G, default),
        "r1 64x128 w4": (G, KC(64, 128, 4, 1, rank_one=True)),
        "r1 64x128 w4 pb2": (pb2, KC(64, 128, 4, 1, rank_one=True)),
        "r1 64x128 w4 pb8": (pb8, KC(64, 128, 4, 1, rank_one=True)),
        "r1 64x128 w8": (G, KC(64, 128, 8, 1, rank_one=True)),
        "r1 32x128 w4": (G, KC(32, 128, 4, 1, rank_one=True)),
        "r1 128x128 w8": (G, KC(128, 128, 8, 1, rank_one=True)),
        "dot (library) again": (G, default),
    }
else:
    VARIANTS = {
        "dot (library)": (G, default),
        "r1 32x32 w2": (G, KC(32, 32, 2, 1, rank_one=True)),
        "r1 32x32 w2 pb2": (pb2, KC(32, 32, 2, 1, rank_one=True)),
        "r1 32x64 w2": (G, KC(32, 64, 2, 1, rank_one=True)),
        "r1 32x32 w1": (G, KC(32, 32, 1, 1, rank_one=True)),
        "dot (library) again": (G, default),
    }
vcfg = G.verify_config(B, 32, N, 128, 128, dev, 16, PREC)


def verify(pool, mod):
    return mod.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], pool, x["slots"], x["parents"],
                               use_qk_l2norm_in_kernel=True, input_precision=PREC, meta=meta, validate=False,
                               config=mod.KernelConfig(*vcfg), launch_dependents=True)


def commit(pool, f, mod, cfg):
    mod.gdn_tree_commit(pool, x["slots"], f, x["parents"], x["accepted"], input_precision=PREC, meta=meta,
                        validate=False, pdl=True, config=mod.KernelConfig(*cfg))  # the module copy's class


keep, graphs = [], {}
for name, (mod, cfg) in VARIANTS.items():
    fresh = x["pool"].clone()
    o, f = verify(fresh, mod)
    ref = R.gdn_tree_commit_ref(fresh.double(), x["slots"], G.TreeFactors(*(t.double() for t in f)), x["parents"],
                                x["accepted"])  # [B, HV, K, V] from the factors, before the commit
    commit(fresh, f, mod, cfg)
    torch.cuda.synchronize()
    got = fresh[x["slots"].long()].double()
    err = float((got - ref).abs().max() / ref.abs().max())
    keep.append((fresh, o, f))
    pool = x["pool"].clone()
    o, f = verify(pool, mod)
    keep.append((pool, o, f))
    for what, fn in (("both", lambda pool=pool, mod=mod, cfg=cfg: commit(pool, verify(pool, mod)[1], mod, cfg)),
                     ("commit", lambda pool=pool, f=f, mod=mod, cfg=cfg: commit(pool, f, mod, cfg))):
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        g.replay()
        torch.cuda.synchronize()
        graphs[(name, what)] = g
    print(f"B = {B} {KIND} {name}: {cfg}, commit err {err:.2e}", flush=True)
times = {k: [] for k in graphs}
for r in range(ROUNDS):
    for k, g in graphs.items():
        times[k].append(1e3 * triton.testing.do_bench(g.replay, warmup=10, rep=100, return_mode="median"))
        torch.cuda.synchronize()
print(f"\nB = {B}, N = {N}, {KIND}, fp32, {PREC} (median of {ROUNDS} rounds, us):\n"
      "| commit | verify + commit | commit alone |\n|---|---|---|")
for name in VARIANTS:
    row = " | ".join(f"{np.median(times[(name, w)]):.1f}" for w in ("both", "commit"))
    print(f"| {name} | {row} |", flush=True)
