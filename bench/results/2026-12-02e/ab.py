"""Sixteenth session. Run 7 found the fault of runs 1-4 with compute-sanitizer: the harness's. Each variant's pool clone
was held only by the closures of its loop iteration; the next iteration dropped them, and the next capture
(``torch.cuda.graph`` calls ``gc.collect()`` and ``empty_cache()``) could unmap the pool that earlier graphs still
read. Run 8 keeps every pool in ``keep``. (Copy of 2026-12-02d/ab.py with ``nopdl``: every launch plain, no
programmatic edge in the graphs, to tell whether the fault of runs 1-4 at B = 16 with all graphs alive needs PDL;
``cap``: fp16 scratch with the apply capped at 128 registers, the commit capped at 128 / 96,
``KernelConfig.max_registers``). Fifteenth session, runs 4 and 5 (run 5: ``serial``, one variant's graphs alive at a
time, against the fault of run 4 at B = 16). Run 4: the library's verify against fp32 scratch and the solve's mask
after its K loop, at one batch size (argv: B), N = 64, random trees, fp32 inputs, tf32. The graphs are built as
crash64.py builds them (outputs kept alive past the capture, no side-stream warm-up), since the probe's graphs
faulted at B >= 16 in their first replay (runs 1-3) while crash64.py's replayed clean; timed in three interleaved
rounds (median of do_bench medians), outputs of each variant checked against the float64 closed form.

Run (GPU): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-02e/ab.py 16 nopdl
"""

import importlib.util
import inspect
import os
import sys
import tempfile

import numpy as np
import torch
import triton

import gdn_tree as T  # bench/gdn_tree.py
from lumotree.optimized import gdn_tree as G

PROBE = os.path.join(os.path.dirname(__file__), "..", "2026-12-02d", "probe.py")
spec = importlib.util.spec_from_file_location("probe", PROBE)
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)

B = int(sys.argv[1])
SERIAL = "serial" in sys.argv[2:]  # one variant's graphs alive at a time: built, timed, freed
NOPDL = "nopdl" in sys.argv[2:]  # no programmatic dependent launch anywhere
CAP = "cap" in sys.argv[2:]  # run 6: fp16 scratch with the apply capped at 128 registers, the commit at 128 / 96
TUNE = "tune" in sys.argv[2:]  # run 10: the apply at 3 stages, commit tiles that fit 5 programs per SM
FLAGS = "flags" in sys.argv[2:]  # run 12: ready counters (needs apply_flags.patch applied)
BV64 = "bv64" in sys.argv[2:]  # run 12: 64-column apply blocks (q / k read half as often)
x = T.make_inputs(B, 64, "random", seed=B * 1000 + 64)
tmp = tempfile.mkdtemp()
late = probe.load_module("ab_mask_late", probe.mask_late(inspect.getsource(G)), tmp)
base_cfg = G.verify_config(B, 32, 64, 128, 128, torch.device("cuda"), 16, "tf32")
VARIANTS = {"default": (G, base_cfg), "scratch32": (G, base_cfg._replace(scratch16=False)),
            "mask_late": (late, base_cfg), "mask_late_scratch32": (late, base_cfg._replace(scratch16=False))}
if NOPDL:
    VARIANTS = {name: (mod, cfg._replace(apply_pdl=False)) for name, (mod, cfg) in VARIANTS.items()}
COMMITS = {}  # variant: commit config (else the library's default)
if CAP:  # fp16 scratch needs 134 apply registers (3 programs per SM) against 127 (4); capped at 128: no spills.
    # The commit: 161 registers (3 per SM); at 128, 4 per SM with 32 bytes of spills. Since run 7 the library's
    # default (verify_config / commit_config at large batches) is fp16 scratch with both caps at 128.
    fp32 = base_cfg._replace(scratch16=False, max_registers=0)
    VARIANTS = {"default": (G, base_cfg), "fp32_uncapped": (G, fp32),
                "fp16_uncapped": (G, fp32._replace(scratch16=True)),
                "fp16_cap128": (G, fp32._replace(scratch16=True, max_registers=128)),
                "fp32_commit_cap128": (G, fp32)}
    commit_cfg = G.commit_config(B, 32, 64, 128, 128, torch.device("cuda"))
    COMMITS = {name: commit_cfg._replace(max_registers=128 if name.endswith("commit_cap128") else 0)
               for name in VARIANTS if name != "default"}
if TUNE:  # compile-only (Triton 3.6, sm_90, aligned): apply at 3 stages 128 registers, no spills (45 KiB of shared
    # memory: 4 programs per SM still fit); commit [64, 64] / [32, 128] tiles at 4 warps capped at 96 (5 per SM, 0 / 8
    # bytes of spills); [64, 128] at 8 warps uncapped 113 (2 per SM), capped at 80 (3 per SM, 40 bytes)
    VARIANTS = {"default": (G, base_cfg), "apply_s3": (G, base_cfg._replace(num_stages=3)),
                "commit_64x64_cap96": (G, base_cfg), "commit_32x128_cap96": (G, base_cfg),
                "commit_64x128_w8": (G, base_cfg), "commit_64x128_w8_cap80": (G, base_cfg)}
    COMMITS = {"commit_64x64_cap96": G.KernelConfig(64, 64, 4, 1, max_registers=96),
               "commit_32x128_cap96": G.KernelConfig(32, 128, 4, 1, max_registers=96),
               "commit_64x128_w8": G.KernelConfig(64, 128, 8, 1),
               "commit_64x128_w8_cap80": G.KernelConfig(64, 128, 8, 1, max_registers=80)}
if FLAGS:  # each apply program waits for its (request, q/k head) group's solve programs only
    VARIANTS = {"default": (G, base_cfg), "flags": (G, base_cfg._replace(apply_flags=True)),
                "default_again": (G, base_cfg), "flags_again": (G, base_cfg._replace(apply_flags=True))}
if BV64:  # run 9: the apply is L2-bound (~120 KiB per program, 64 of them q / k); 64 columns read q / k half as
    # often: ~288 instead of ~480 KiB per (request, value head). Compile-only (aligned, Triton 3.6): 8 warps,
    # 3 stages 124 registers, 56 KiB (2 programs per SM: 16 warps, as now); 4 warps, 3 stages 166, 3 per SM
    VARIANTS = {"default": (G, base_cfg),
                "bv64_w8_s3": (G, base_cfg._replace(block_v=64, num_warps=8, num_stages=3, max_registers=0)),
                "bv64_w8_s2": (G, base_cfg._replace(block_v=64, num_warps=8, num_stages=2, max_registers=0)),
                "bv64_w4_s3": (G, base_cfg._replace(block_v=64, num_warps=4, num_stages=3, max_registers=0))}
meta = G.tree_meta(x["parents"])
keep = []
graphs = {}
times = {}
for name, (mod, cfg) in VARIANTS.items():
    cfg = mod.KernelConfig(*cfg)
    pool = x["pool"].clone()
    keep.append(pool)  # alive as long as the graphs: each capture's gc.collect() + empty_cache() would unmap it

    def verify(signal=False, mod=mod, cfg=cfg, pool=pool):
        return mod.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], pool, x["slots"], x["parents"],
                                   use_qk_l2norm_in_kernel=True, input_precision="tf32", meta=meta, validate=False,
                                   config=cfg, launch_dependents=signal and not NOPDL)

    def both(verify=verify, mod=mod, pool=pool, commit_cfg=COMMITS.get(name)):
        o, f = verify(signal=True)
        mod.gdn_tree_commit(pool, x["slots"], f, x["parents"], x["accepted"], input_precision="tf32", meta=meta,
                            validate=False, pdl=not NOPDL, config=commit_cfg)
        return o, f

    for what, fn in (("verify", verify), ("both", both)):
        keep.append(fn())
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            keep.append(fn())
        g.replay()
        torch.cuda.synchronize()
        graphs[(name, what)] = g
    err_o, err_s = T.errors(x, "tf32", min(B, 2), mod=mod, config=cfg)
    print(f"B = {B} {name}: config {tuple(cfg)}, err o {err_o:.2e} S {err_s:.2e}", flush=True)
    if SERIAL:
        for k, g in graphs.items():
            print(f"timing {k}", flush=True)
            times[k] = [1e3 * triton.testing.do_bench(g.replay, warmup=10, rep=100, return_mode="median")
                        for _ in range(3)]
            torch.cuda.synchronize()
        graphs.clear()
        keep.clear()
if not SERIAL:
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
