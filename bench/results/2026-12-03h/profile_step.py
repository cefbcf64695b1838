"""Thirty-third session: where the fused step's time goes (B = 64, N = 64, random trees, norms in the kernel).

``bench/gdn_fused.py`` (run 93) measured the fused step (``gdn_tree_verify_fused`` + ``gdn_tree_record``) at 224.4
us against the probe's 190.9 us verify + 14.8 us record. This script replays the step's CUDA graph under the torch
profiler (per-kernel durations and the gaps between kernels), and times the record alone with nothing pending
(``active`` reset by a memset in the graph, the memset timed alone too) at 1 / 2 / 4 / 8 warps.

Run (GPU): ``PYTHONPATH=$PWD:$PWD/bench python bench/results/2026-12-03h/profile_step.py [--out PATH]``.
"""
import argparse
import json
import os
import sys
from collections import defaultdict

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import gdn_fused as BF  # noqa: E402
import gdn_tree as bench_gdn  # noqa: E402

from lumotree.optimized import gdn_tree as G  # noqa: E402
from lumotree.optimized import gdn_tree_pending as PD  # noqa: E402


def profile_graph(fn, reps=30):
    """Per-kernel median durations and the median gap before each kernel, over ``reps`` graph replays."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            graph.replay()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
    events = [e for e in events if "Memcpy" not in e.name]
    durs, gaps = defaultdict(list), defaultdict(list)
    prev_end = None
    for e in events:
        name = e.name[:60]
        durs[name].append(e.time_range.end - e.time_range.start)
        if prev_end is not None:
            gaps[name].append(e.time_range.start - prev_end)
        prev_end = e.time_range.end
    med = lambda xs: sorted(xs)[len(xs) // 2] if xs else float("nan")  # noqa: E731
    return {n: dict(us=med(d), gap_us=med(gaps[n]), count=len(d)) for n, d in durs.items()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="profile_step.json")
    parser.add_argument("--B", type=int, default=64)
    args = parser.parse_args()
    x = bench_gdn.make_inputs(args.B, 64, "random", 0)
    step, verify, record, pool, pending, state = BF.fused_fns(x)
    out = dict(card=torch.cuda.get_device_name(), B=args.B)
    out["step_graph_us"] = bench_gdn.graph_time(step)[0]
    out["verify_graph_us"] = bench_gdn.graph_time(verify)[0]
    out["profile_step"] = profile_graph(step)
    print(f"step {out['step_graph_us']:.1f} us, verify alone {out['verify_graph_us']:.1f} us")
    for n, r in out["profile_step"].items():
        print(f"  {n:60s} {r['us']:7.1f} us  gap before {r['gap_us']:6.1f} us  x{r['count']}")
    verify()
    meta = G.tree_meta(x["parents"])
    reset = lambda: pending.active.zero_()  # noqa: E731
    out["memset_us"] = bench_gdn.graph_time(reset)[0]
    print(f"memset of active {out['memset_us']:.1f} us")
    f = state["factors"]
    delta, log_gamma, k, k_rnorm = f.delta, f.log_gamma, f.k, f.k_rnorm
    B, N, H = k.shape[:3]
    HV = delta.shape[2]
    slots, accepted = x["slots"], x["accepted"]
    out["record"] = {}
    for warps in (1, 2, 4):
        def rec(w=warps):
            pending.active.zero_()
            PD._record_kernel[(B * H, )](
                pool, pending.kpt, pending.dp, pending.gamma_a, pending.active, slots, meta.words, slots, accepted,
                delta, log_gamma, k, k_rnorm, N, k.stride(0), k.stride(1), k.stride(2), H=H, HV=HV, K=128, V=128,
                W=meta.words.shape[2], NP=64, PATH=16, BV=32, L2NORM=True, HAS_NUM=False, WORD_BITS=32,
                num_warps=w)
        t = bench_gdn.graph_time(rec)[0]
        out["record"][warps] = t
        print(f"record alone (+ memset), {warps} warps: {t:.1f} us")
    from lumotree.optimized import _gdn_fused_gluon as F  # noqa: PLC0415
    default = F.SOLVER_REGS
    out["solver_regs"] = {}
    for regs in (200, default):  # the solve partition's register budget (a constant of the launch)
        F.SOLVER_REGS = regs
        out["solver_regs"][regs] = dict(step_us=bench_gdn.graph_time(step)[0],
                                        verify_us=bench_gdn.graph_time(verify)[0])
        print(f"SOLVER_REGS {regs}: step {out['solver_regs'][regs]['step_us']:.1f} us, verify "
              f"{out['solver_regs'][regs]['verify_us']:.1f} us")
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
