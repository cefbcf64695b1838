"""Thirty-third session: the probe's FOLD 28 kernel alone, by the profiler, beside the library's (run 101).

``gluon_probe.py`` times its variants as CUDA-graph replays of its preparation kernel plus the Gluon kernel
(190.2 us in run 95); the library's kernel alone took 202.4 us in run 98's profile. This runs ``gluon_probe``'s
``main`` (``--variants 16,3,28,8,192,4``) and then ``bench/gdn_fused.py``'s step under ``torch.profiler`` and
prints every CUDA kernel's median duration, so the two kernels are compared without launch gaps or their
preparation.

Run (GPU): ``PYTHONPATH=$PWD:$PWD/bench:<fla> python bench/results/2026-12-03h/probe_profile.py``.
"""
import os
import sys
from collections import defaultdict

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "2026-12-03g"))
import gdn_fused as BF  # noqa: E402
import gdn_tree as bench_gdn  # noqa: E402
import gluon_probe as GP  # noqa: E402


def kernel_medians(prof):
    durs = defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            durs[e.name[:50]].append(e.time_range.end - e.time_range.start)
    return {n: (sorted(d)[len(d) // 2], len(d)) for n, d in durs.items()}


def main():
    sys.argv = [sys.argv[0], "--variants", "16,3,28,8,192,4", "--out", os.environ.get("OUT", ".") + "/pp.json"]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA], acc_events=True) as prof:
        GP.main()
        torch.cuda.synchronize()
    print("probe run's kernels (median us, count):")
    for n, (us, c) in sorted(kernel_medians(prof).items(), key=lambda kv: -kv[1][1]):
        if c >= 10:
            print(f"  {n:50s} {us:8.1f}  x{c}")
    x = bench_gdn.make_inputs(64, 64, "random", 0)
    step, _, _, _, _, _ = BF.fused_fns(x)
    step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA], acc_events=True) as prof:
        for _ in range(30):
            step()
        torch.cuda.synchronize()
    print("library step's kernels (median us, count):")
    for n, (us, c) in kernel_medians(prof).items():
        print(f"  {n:50s} {us:8.1f}  x{c}")


if __name__ == "__main__":
    main()
