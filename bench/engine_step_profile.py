"""Where the host time of an engine step goes (issue 7): the bench model at B = 1, one tree run (synthetic drafter,
fixed budget) and one autoregressive run, with every phase of a step timed between device synchronisations, plus a
cProfile of the unsynchronised steps; the step times come from a third run with neither.

Phases: ``draft`` (drafter.propose), ``pack`` (TreeBatch.pack), ``speculate`` (target.speculate_greedy: verify,
greedy acceptance and commit in one graph replay, the outcome's copy back), ``decode`` / ``sample``
(autoregressive); the rest of a step (outcome.emitted, drafter.advance, bookkeeping) is the step time minus these.
A synchronisation before and after each phase charges the device work to the phase that launched it, so the phase
times add up to more than an unsynchronised step; the unsynchronised step time is reported beside them.

Run (GPU): ``PYTHONPATH=$PWD python bench/engine_step_profile.py --out engine_profile.json``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from collections import defaultdict

import numpy as np
import torch

from lumotree.optimized import engine as eng
from lumotree.optimized import sampling as smp
from lumotree.optimized.cli import RANDOM_CONFIGS
from lumotree.optimized.drafters import SyntheticDrafter
from lumotree.optimized.model import OptimizedModel, random_tensors
from lumotree.optimized.sampling import SamplingParams
from lumotree.reference.config import HybridConfig


class PhaseTimer:
    """Wall time per phase, with a device synchronisation on entry and exit (``enabled``) or none."""

    def __init__(self, device: torch.device):
        self.device, self.enabled, self.times = device, False, defaultdict(list)
        self.label = False  # profiler ranges (torch.profiler.record_function) around each phase, no synchronisation
        self.sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            if self.label:
                with torch.profiler.record_function(f"phase:{name}"):
                    return fn(*args, **kwargs)
            if not self.enabled:
                return fn(*args, **kwargs)
            self.sync()
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            self.sync()
            self.times[name].append(time.perf_counter() - t0)
            return out
        return timed


def trace_tree_steps(args, target, oracle, config, buckets, prompt, timer) -> list[dict]:
    """Profile a short tree run; per engine step: wall ms, GPU busy ms (union of kernel intervals), the idle gaps
    longer than 20 us, and the host phases (from the record_function ranges)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    drafter = SyntheticDrafter(args.acceptance, oracle, config.vocab_size)
    drafter.propose = timer.wrap("draft", drafter.propose)
    e = eng.Engine(target, drafter, mode="tree", budget="fixed", max_nodes=args.nodes, node_buckets=buckets,
                   batch_buckets=[1], seed=0)
    e.generate([prompt], SamplingParams(max_new_tokens=8))
    e = eng.Engine(target, drafter, mode="tree", budget="fixed", max_nodes=args.nodes, node_buckets=buckets,
                   batch_buckets=[1], seed=0)
    e.submit(prompt, SamplingParams(max_new_tokens=48))
    e.step()  # the prefill
    timer.label = True
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        while e.has_work():
            with record_function("engine_step"):
                e.step()
        torch.cuda.synchronize()
    timer.label = False
    prof.export_chrome_trace(args.trace)
    with open(args.trace) as f:
        events = [ev for ev in json.load(f)["traceEvents"] if ev.get("ph") == "X"]
    kernels = sorted((ev["ts"], ev["ts"] + ev["dur"]) for ev in events if ev.get("cat") == "kernel")
    steps = sorted((ev["ts"], ev["ts"] + ev["dur"]) for ev in events
                   if ev.get("cat") == "user_annotation" and ev["name"] == "engine_step")
    phases = [ev for ev in events if ev.get("cat") == "user_annotation" and ev["name"].startswith("phase:")]
    out = []
    for t0, t1 in steps:
        busy, gaps, cursor = 0.0, [], t0
        for k0, k1 in kernels:
            if k1 <= t0 or k0 >= t1:
                continue
            k0, k1 = max(k0, t0), min(k1, t1)
            if k0 - cursor > 20:
                gaps.append((round((cursor - t0) / 1e3, 3), round((k0 - cursor) / 1e3, 3)))
            if k1 > cursor:
                busy += k1 - max(k0, cursor)
                cursor = k1
        if t1 - cursor > 20:
            gaps.append((round((cursor - t0) / 1e3, 3), round((t1 - cursor) / 1e3, 3)))
        host = {ev["name"][6:]: (round((ev["ts"] - t0) / 1e3, 3), round(ev["dur"] / 1e3, 3)) for ev in phases
                if t0 <= ev["ts"] < t1}
        row = {"wall_ms": (t1 - t0) / 1e3, "gpu_busy_ms": busy / 1e3, "idle_gaps_ms (at, length)": gaps,
               "phases_ms (at, length)": host}
        out.append(row)
        print(json.dumps(row), flush=True)
    return out


def profile_check(args, target, oracle, config, buckets, prompt) -> dict:
    """``Engine.measure_profile`` twice (as bench/e2e.py, 3 repeats) and once with 9 repeats, then fixed-N tree runs:
    the profile's T(1, N) beside the median model time of those steps."""
    profiles = []
    for repeats in (3, 3, 9):
        e = eng.Engine(target, None, mode="autoregressive", max_nodes=args.nodes, node_buckets=buckets,
                       batch_buckets=[1])
        profiles.append(e.measure_profile(repeats=repeats))
    out = {"profile_ms": [{str(n): 1e3 * p.verify_time(1, n) for n in buckets} for p in profiles],
           "decode_ms": [1e3 * p.decode_time(1) for p in profiles], "observed_model_ms": {}}
    for n in args.profile_check:
        drafter = SyntheticDrafter(args.acceptance, oracle, config.vocab_size)
        e = eng.Engine(target, drafter, mode="tree", budget="fixed", max_nodes=n, node_buckets=buckets,
                       batch_buckets=[1], seed=0)
        e.generate([prompt], SamplingParams(max_new_tokens=args.new_tokens))
        steps = [s for s in e.stats.steps if s.kind == "verify"]
        out["observed_model_ms"][str(n)] = 1e3 * float(np.median([s.model_s for s in steps]))
    print("profile check (ms): decode", [round(x, 3) for x in out["decode_ms"]], flush=True)
    for n in buckets:
        seen = out["observed_model_ms"].get(str(n))
        print(f"   N={n:3d}  profile {[round(p[str(n)], 3) for p in out['profile_ms']]}"
              + (f"  observed {seen:.3f}" if seen is not None else ""), flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="bench", choices=sorted(RANDOM_CONFIGS))
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--acceptance", type=float, default=0.8)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--out", default="engine_profile.json")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test (tiny config, Triton interpreter, fp32)")
    ap.add_argument("--profile-check", type=int, nargs="*", default=[], metavar="N",
                    help="also measure the engine's cost profile twice and compare T(1, N) with the model time of "
                    "fixed-N tree steps (the budget's inputs against what the steps cost)")
    ap.add_argument("--trace", default=None, help="also trace a short tree run (torch profiler, CPU + CUDA) into this "
                    "Chrome-trace JSON and print, per step, its wall time, the GPU's busy time and idle gaps")
    args = ap.parse_args()
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    config = HybridConfig(**RANDOM_CONFIGS[args.config])
    tensors = random_tensors(config, 0, dev, dtype, successor=True)
    model = OptimizedModel(config, tensors, num_slots=1, max_seq_len=args.prompt_len + args.new_tokens + 192,
                           max_nodes=args.nodes, device=dev, dtype=dtype)
    del tensors
    target = eng.OptimizedTarget(model, batch_buckets=[1], validate=False)
    buckets = tuple(n for n in (1, 2, 4, 8, 16, 32, 64, 128) if n <= args.nodes)
    prompt = np.random.default_rng(0).integers(0, config.vocab_size, args.prompt_len).tolist()
    params = SamplingParams(max_new_tokens=args.new_tokens)

    timer = PhaseTimer(dev)
    target.speculate_greedy = timer.wrap("speculate", target.speculate_greedy)
    target.decode = timer.wrap("decode", target.decode)
    pack = smp.TreeBatch.pack
    smp.TreeBatch.pack = staticmethod(timer.wrap("pack", pack))

    def engine_for(mode: str, drafter):
        e = eng.Engine(target, drafter, mode=mode, budget="fixed" if mode != "autoregressive" else "none",
                       max_nodes=args.nodes, node_buckets=buckets, batch_buckets=[1], seed=0)
        e._sample_rows = timer.wrap("sample", e._sample_rows)
        return e

    result = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "config": args.config,
              "nodes": args.nodes, "acceptance": args.acceptance, "runs": {}}
    oracle = None
    for mode in ("autoregressive", "tree"):
        drafter = None if mode == "autoregressive" else SyntheticDrafter(args.acceptance, oracle, config.vocab_size)
        if drafter is not None:
            drafter.propose = timer.wrap("draft", drafter.propose)
        engine_for(mode, drafter).generate([prompt], SamplingParams(max_new_tokens=16))  # warm-up: graphs, caches
        e = engine_for(mode, drafter)  # the clean run: no profiler, no extra synchronisation
        out = e.generate([prompt], params)
        steps = [s for s in e.stats.steps if s.kind != "prefill"]
        if mode == "autoregressive":
            oracle = {tuple(prompt): out[0].tokens}
        prof = cProfile.Profile()
        prof.enable()
        engine_for(mode, drafter).generate([prompt], params)
        prof.disable()
        timer.times.clear()
        timer.enabled = True
        e2 = engine_for(mode, drafter)
        e2.generate([prompt], params)
        timer.enabled = False
        stream = io.StringIO()
        pstats.Stats(prof, stream=stream).sort_stats("tottime").print_stats(25)
        run = {
            "steps": len(steps),
            "step_ms": 1e3 * float(np.median([s.total_s for s in steps])),
            "model_ms": 1e3 * float(np.median([s.model_s for s in steps])),
            "draft_ms": 1e3 * float(np.median([s.draft_s for s in steps])),
            "tokens_per_step": float(np.mean([s.emitted for s in steps])),
            "synced_phase_ms": {k: 1e3 * float(np.median(v)) for k, v in timer.times.items()},
            "synced_phase_calls": {k: len(v) for k, v in timer.times.items()},
            "cprofile_tottime": stream.getvalue(),
        }
        result["runs"][mode] = run
        print(f"== {mode}: {run['steps']} steps, model {run['model_ms']:.3f} ms, draft {run['draft_ms']:.3f} ms, "
              f"step {run['step_ms']:.3f} ms, {run['tokens_per_step']:.2f} tokens a step", flush=True)
        for k, v in run["synced_phase_ms"].items():
            print(f"   {k:14s} {v:8.3f} ms  x{run['synced_phase_calls'][k]}")
        print(run["cprofile_tottime"][:6000])
    if args.profile_check:
        result["profile_check"] = profile_check(args, target, oracle, config, buckets, prompt)
    if args.trace and dev.type == "cuda":
        result["trace"] = trace_tree_steps(args, target, oracle, config, buckets, prompt, timer)
    from triton.testing import do_bench

    for rows in (1, args.nodes) if dev.type == "cuda" else ():  # device time of the argmax greedy acceptance reads
        logits = torch.randn(1, rows, config.vocab_size, device=dev)
        result[f"argmax_us_{rows}_rows"] = 1e3 * do_bench(lambda: logits.argmax(-1), return_mode="median")
        print(f"argmax of [1, {rows}, {config.vocab_size}] fp32: {result[f'argmax_us_{rows}_rows']:.1f} us")
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
