"""Seventeenth session, run 13: launch-order and tiling A / B of verify + commit at one batch size (argv: B, then
``large`` or ``small``), N = 64, random trees, fp32 inputs, tf32. Built as ``2026-12-02e/ab.py`` builds its graphs
(every pool kept alive with its graphs; three interleaved rounds, median of do_bench medians).

Run 12 found 64-column apply blocks at 4 warps and 3 stages (``bv64_w4_s3``: 166 registers, 3 programs per SM)
12 µs faster in the verify alone at B = 64 (282.0 -> 270.0) but only 0.9 faster with the commit behind it
(361.4 -> 360.5). The commit is a PDL launch that the apply lets launch at its start (``launch_dependents``):
its programs take the SMs' free slots, load their ``S0`` tile and wait. ``large`` asks whether that early launch
costs the apply its last waves: the apply signalling after its K loop (``sig_late``, a source variant) or not at
all (``nosig``: the commit launches as the apply ends), each with 32- and 64-column apply blocks.
``small`` (B = 1): the apply at 16 columns (256 programs: two per SM), 64-row K chunks (two instead of
four steps on the solve's critical path) and commit tilings. Both: the q / k
hand-off (``KernelConfig.qk_handoff``: normalised q / k in fp16 from the solve, half the apply's q / k bytes;
measured slower in run 13 and removed from the library: ``qk_handoff.patch`` beside this file restores it, and
this script's hand-off variants need it).

Each variant's pool after one eager verify + commit on a fresh clone is compared with the default's (``pool diff``),
and its outputs and committed state against float64 (``err``).

Run (GPU): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-02f/ab13.py 64 large
"""

import importlib.util
import inspect
import sys
import tempfile

import numpy as np
import torch
import triton

import gdn_tree as T  # bench/gdn_tree.py
from lumotree.optimized import gdn_tree as G


def load_module(name: str, source: str, tmp: str):
    """``source`` as the module ``lumotree.optimized.<name>`` (a file, so that Triton can read its kernels)."""
    path = f"{tmp}/{name}.py"
    with open(path, "w") as fh:
        fh.write(source)
    spec = importlib.util.spec_from_file_location(f"lumotree.optimized.{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def signal_late(src: str) -> str:
    """The apply lets its PDL successor launch after its K loop and wait, not at its start."""
    start = src.index("def _gdn_tree_apply_kernel(")
    end = src.index("@triton.jit", start)
    body = src[start:end]
    first = "    allow_dependents(SIGNAL)  # a PDL-launched successor (gdn_tree_commit(pdl=True)) may launch now\n"
    wait = "        tl.extra.cuda.gdc_wait()  # from here on the solve's outputs are complete and visible\n"
    assert body.count(first) == 1 and body.count(wait) == 1
    body = body.replace(first, "").replace(wait, wait + "    allow_dependents(SIGNAL)\n")
    return src[:start] + body + src[end:]


def commit_streaming(src: str) -> str:
    """The commit reads its ``S0`` tile with ``evict_first`` and writes it back with ``.cs`` (streaming: the state
    passes through L2 once, so its lines need not push out the path factors or other requests' tiles)."""
    start = src.index("def _gdn_tree_commit_kernel(")
    end = src.index("# ---", start)
    body = src[start:end]
    load, store = "    s = tl.load(state_ptrs)  #", "    tl.store(state_ptrs, s)\n"
    assert body.count(load) == 1 and body.count(store) == 1
    body = body.replace(load, '    s = tl.load(state_ptrs, eviction_policy="evict_first")  #')
    body = body.replace(store, '    tl.store(state_ptrs, s, cache_modifier=".cs")\n')
    return src[:start] + body + src[end:]


B = int(sys.argv[1])
WHAT = sys.argv[2]
x = T.make_inputs(B, 64, "random", seed=B * 1000 + 64)
late = load_module("ab13_signal_late", signal_late(inspect.getsource(G)), tempfile.mkdtemp())
base = G.verify_config(B, 32, 64, 128, 128, torch.device("cuda"), 16, "tf32")
base_commit = G.commit_config(B, 32, 64, 128, 128, torch.device("cuda"), "tf32")
bv64 = base._replace(block_v=64, num_warps=4, num_stages=3, max_registers=0)
# name: (module, verify config, commit config, the apply signals its successor)
if WHAT == "large":
    VARIANTS = {"default": (G, base, base_commit, True),
                "sig_late": (late, base, base_commit, True),
                "nosig": (G, base, base_commit, False),
                "bv64": (G, bv64, base_commit, True),
                "bv64_nosig": (G, bv64, base_commit, False),
                "handoff": (G, base._replace(qk_handoff=True), base_commit, True),
                "handoff_nosig": (G, base._replace(qk_handoff=True), base_commit, False),
                "bv64_handoff": (G, bv64._replace(qk_handoff=True), base_commit, True),
                "bv64_handoff_nosig": (G, bv64._replace(qk_handoff=True), base_commit, False)}
elif WHAT == "wide":  # run 14, after KernelConfig.early_signal: the library's default against both forms
    narrow = base._replace(block_v=32, max_registers=128, early_signal=True)
    VARIANTS = {"default": (G, base, base_commit, True), "narrow": (G, narrow, base_commit, True),
                "wide": (G, narrow._replace(block_v=64, max_registers=0, early_signal=False), base_commit, True)}
elif WHAT == "cap":  # prepared for run 15 (not run: no device time left): the 64-column apply capped at 128
    # registers, compile-only (aligned, Triton 3.6): 48 bytes of stack at 2 or 3 stages (32 / 56 KiB of shared
    # memory), so 4 programs per SM instead of 3 if the shared memory allows (4 x 56 KiB is at the SM's limit at 3
    # stages); with the early commit launch too, which the uncapped form leaves no room for
    wide = base._replace(block_v=64, num_warps=4, num_stages=3, max_registers=0, early_signal=False)
    VARIANTS = {"default": (G, base, base_commit, True),
                "narrow": (G, wide._replace(block_v=32, max_registers=128, early_signal=True), base_commit, True),
                "wide": (G, wide, base_commit, True),
                "wide_cap128": (G, wide._replace(max_registers=128), base_commit, True),
                "wide_cap128_early": (G, wide._replace(max_registers=128, early_signal=True), base_commit, True),
                "wide_s2_cap128": (G, wide._replace(num_stages=2, max_registers=128), base_commit, True),
                "wide_s2_cap128_early": (G, wide._replace(num_stages=2, max_registers=128, early_signal=True),
                                         base_commit, True)}
    if B == 64:  # run 15: the commit streaming its state tiles (load evict_first, store .cs)
        stream = load_module("ab13_commit_stream", commit_streaming(inspect.getsource(G)), tempfile.mkdtemp())
        VARIANTS["wide_commit_stream"] = (stream, wide, base_commit, True)
else:
    VARIANTS = {"default": (G, base, base_commit, True),
                "nosig": (G, base, base_commit, False),
                "apply_bv16": (G, base._replace(block_v=16), base_commit, True),
                "handoff": (G, base._replace(qk_handoff=True), base_commit, True),
                "bk64_s2": (G, base._replace(block_k=64, num_stages=2, solve_stages=2), base_commit, True),
                "bk64_s3": (G, base._replace(block_k=64), base_commit, True),
                "commit_32x16_w2": (G, base, G.KernelConfig(32, 16, 2, 1), True),
                "commit_64x32_w4": (G, base, G.KernelConfig(64, 32, 4, 1), True),
                "commit_32x64_w4": (G, base, G.KernelConfig(32, 64, 4, 1), True),
                "commit_16x32_w2": (G, base, G.KernelConfig(16, 32, 2, 1), True)}
meta = G.tree_meta(x["parents"])
keep, graphs, pools = [], {}, {}
for name, (mod, cfg, commit_cfg, signal) in VARIANTS.items():
    cfg, commit_cfg = mod.KernelConfig(*cfg), mod.KernelConfig(*commit_cfg)

    def verify(sig=False, mod=mod, cfg=cfg, pool=None):
        return mod.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], pool, x["slots"], x["parents"],
                                   use_qk_l2norm_in_kernel=True, input_precision="tf32", meta=meta, validate=False,
                                   config=cfg, launch_dependents=sig)

    def both(pool, verify=verify, mod=mod, commit_cfg=commit_cfg, signal=signal):
        o, f = verify(sig=signal, pool=pool)
        mod.gdn_tree_commit(pool, x["slots"], f, x["parents"], x["accepted"], input_precision="tf32", meta=meta,
                            validate=False, pdl=True, config=commit_cfg)
        return o, f

    fresh = x["pool"].clone()
    both(fresh)
    torch.cuda.synchronize()
    pools[name] = fresh
    pool = x["pool"].clone()
    keep.append(pool)  # alive as long as the graphs: each capture's gc.collect() + empty_cache() would unmap it
    for what, fn in (("verify", lambda verify=verify, pool=pool: verify(pool=pool)),
                     ("both", lambda both=both, pool=pool: both(pool))):
        keep.append(fn())
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            keep.append(fn())
        g.replay()
        torch.cuda.synchronize()
        graphs[(name, what)] = g
    err_o, err_s = T.errors(x, "tf32", min(B, 2), mod=mod, config=cfg)
    diff = float((pools[name] - pools["default"]).abs().max())
    print(f"B = {B} {name}: verify {tuple(cfg)}, commit {tuple(commit_cfg)}, signal {signal}, "
          f"err o {err_o:.2e} S {err_s:.2e}, pool diff {diff:.2e}", flush=True)
times = {k: [] for k in graphs}
for r in range(3):
    for k, g in graphs.items():
        times[k].append(1e3 * triton.testing.do_bench(g.replay, warmup=10, rep=100, return_mode="median"))
        torch.cuda.synchronize()
print(f"\nB = {B}, N = 64, random, fp32, tf32 (median of 3 rounds, us):\n| variant | verify + commit | verify |")
print("|---|---|---|")
for name in VARIANTS:
    print(f"| {name} | {np.median(times[(name, 'both')]):.1f} | {np.median(times[(name, 'verify')]):.1f} |",
          flush=True)
