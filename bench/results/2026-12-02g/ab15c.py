"""Eighteenth session, run 16: the commit streaming its tile in chunks (``KernelConfig.chunk_rows``: the program
loads its first two ``[chunk_rows, BV]`` chunks of ``S0`` before its PDL wait, gathers the path once, then updates
and stores chunk c while chunk c + 2 loads), against the whole-tile kernel of HEAD (``old``, the source given as
argv[2]) and the library's default, behind the library's verify (fp32 inputs, tf32, random trees, N = 64).

Verify + commit and commit alone (a graph of the commit only, each replay on the same committed pool: the state
values change between replays but not the work), median of three interleaved rounds of do_bench medians; every
pool kept alive with its graphs. ``diff``: each variant's committed pool after one eager verify + commit on a fresh
clone against the old kernel's (max |diff| / max |pool|).

Run (GPU): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-02g/ab15c.py 64 /tmp/old_gdn_tree.py
(the chunk variants need ``chunked_commit.diff`` applied: the library dropped ``chunk_rows`` after run 16).

Run 17 (argv[3] ``latency``): the old module (HEAD before ``tail_latency.diff``) against the library with the
commit's words read for every row before the accepted node is known (``accepted_path_of``) and the apply's
``QKD`` loaded with ``TB`` when its programs fit in one wave (``QKD_EARLY``), and with the first change alone;
five rounds.
"""

import importlib.util
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
old = load_module("ab15_old", sys.argv[2])
x = T.make_inputs(B, 64, "random", seed=B * 1000 + 64)
dev = torch.device("cuda")
vcfg = G.verify_config(B, 32, 64, 128, 128, dev, 16, "tf32")
ccfg = G.commit_config(B, 32, 64, 128, 128, dev, "tf32")
C = G.KernelConfig
MODE = sys.argv[3] if len(sys.argv) > 3 else "chunks"
ROUNDS = 3
if MODE == "latency":  # run 17: the old module against the library with its two latency changes, and with the
    # commit's alone (the apply's QKD_EARLY forced off in a copy of the library's source)
    src = open(G.__file__).read()
    rule = "QKD_EARLY=B * HV * (V // block_v) <= _num_sms(device)"
    assert src.count(rule) == 1
    with open("/tmp/ab17_late_qkd.py", "w") as fh:
        fh.write(src.replace(rule, "QKD_EARLY=False"))
    late = load_module("ab17_late_qkd", "/tmp/ab17_late_qkd.py")
    VARIANTS = {"old": (old, ccfg), "new": (G, ccfg), "new_late_qkd": (late, ccfg)}
    ROUNDS = 5
elif B * 32 * 2 >= 2 * 132:  # large batches
    VARIANTS = {"old": (old, ccfg), "default": (G, ccfg),
                "c64_cap128": (G, C(64, 128, 4, 1, max_registers=128, chunk_rows=64)),
                "c32_cap128": (G, C(64, 128, 4, 1, max_registers=128, chunk_rows=32)),
                "c16": (G, C(64, 128, 4, 1, chunk_rows=16)),
                "bv128_c16_cap128": (G, C(128, 128, 4, 1, max_registers=128, chunk_rows=16)),
                "bv32_c32": (G, C(32, 128, 4, 1, chunk_rows=32)),
                "bv32_c16": (G, C(32, 128, 4, 1, chunk_rows=16)),
                "bv32_c32_w2": (G, C(32, 128, 2, 1, chunk_rows=32))}
else:
    VARIANTS = {"old": (old, ccfg), "default": (G, ccfg),
                "c16": (G, ccfg._replace(chunk_rows=16)),
                "bk64_c32": (G, C(32, 64, 2, 1, chunk_rows=32)),
                "bk64_c16": (G, C(32, 64, 2, 1, chunk_rows=16)),
                "bv32_c32": (G, C(32, 128, 4, 1, chunk_rows=32)),
                "bv64_c16": (G, C(64, 32, 4, 1, chunk_rows=16))}
meta = G.tree_meta(x["parents"])


def verify(pool, mod):
    return mod.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], pool, x["slots"], x["parents"],
                             use_qk_l2norm_in_kernel=True, input_precision="tf32", meta=meta, validate=False,
                             config=mod.KernelConfig(*vcfg[:len(mod.KernelConfig._fields)]),
                             launch_dependents=True)


keep, graphs, pools = [], {}, {}
for name, (mod, cfg) in VARIANTS.items():
    cfg = mod.KernelConfig(*cfg[:len(mod.KernelConfig._fields)])  # the old module has no chunk_rows

    def commit(pool, f, mod=mod, cfg=cfg):
        mod.gdn_tree_commit(pool, x["slots"], f, x["parents"], x["accepted"], input_precision="tf32", meta=meta,
                            validate=False, pdl=True, config=cfg)

    fresh = x["pool"].clone()
    o, f = verify(fresh, mod)
    commit(fresh, f)
    torch.cuda.synchronize()
    pools[name] = fresh
    pool = x["pool"].clone()
    keep.append(pool)
    o, f = verify(pool, mod)
    keep.append((o, f))
    for what, fn in (("both", lambda pool=pool, commit=commit, mod=mod: commit(pool, verify(pool, mod)[1])),
                     ("commit", lambda pool=pool, commit=commit, f=f: commit(pool, f))):
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        g.replay()
        torch.cuda.synchronize()
        graphs[(name, what)] = g
    ref = pools["old"]
    diff = float((pools[name] - ref).abs().max() / ref.abs().max())
    print(f"B = {B} {name}: commit {tuple(cfg)}, diff {diff:.2e}", flush=True)
times = {k: [] for k in graphs}
for r in range(ROUNDS):
    for k, g in graphs.items():
        times[k].append(1e3 * triton.testing.do_bench(g.replay, warmup=10, rep=100, return_mode="median"))
        torch.cuda.synchronize()
state_bytes = 2 * B * 32 * 128 * 128 * 4
print(f"\nB = {B}, N = 64, random, fp32, tf32 (median of {ROUNDS} rounds, us):\n| variant | verify + commit | commit | "
      f"commit TB/s |\n|---|---|---|---|")
for name in VARIANTS:
    c = np.median(times[(name, 'commit')])
    print(f"| {name} | {np.median(times[(name, 'both')]):.1f} | {c:.1f} | {state_bytes / c / 1e6:.2f} |", flush=True)
