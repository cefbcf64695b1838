"""Where the GDN tree verify spends its time: each kernel of the split pipeline timed alone, one GPU.

Times (CUDA-graph replay, median of ``triton.testing.do_bench``) at Qwen3-Next shapes, random trees, tf32, fp32
inputs: the whole verify, the solve kernel alone, the apply kernel alone (the other replaced by a no-op launch),
the fused kernel, the commit; at (B, N) = (64, 64), (16, 64), (1, 64). With ``--ncu`` it instead launches each
kernel once (after a compile launch) for Nsight Compute to profile:

    ncu --clock-control none -k regex:_gdn_tree --launch-count 8 --set basic ... python bench/gdn_profile.py --ncu

Run: ``PYTHONPATH=$PWD python bench/gdn_profile.py [--ncu] [--out PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gdn_tree as bench_gdn  # noqa: E402  make_inputs, graph_time

from lumotree.optimized import gdn_tree as G  # noqa: E402

H, HV, K, V = bench_gdn.H, bench_gdn.HV, bench_gdn.K, bench_gdn.V


class _NoLaunch:
    """Stands in for a Triton kernel whose launch is to be left out: ``kernel[grid](...)`` does nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def _verify(x, mode, config=None):
    return G.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], x["pool"], x["slots"], x["parents"],
                             use_qk_l2norm_in_kernel=True, input_precision=mode, meta=x["meta"], validate=False,
                             config=config)


def _without(name: str, fn):
    """``fn`` with the kernel ``G.<name>`` replaced by a no-op launch while it runs (also under graph capture)."""
    def run():
        kernel = getattr(G, name)
        setattr(G, name, _NoLaunch())
        try:
            return fn()
        finally:
            setattr(G, name, kernel)
    return run


KC = G.KernelConfig
# B >= 16: split pipeline variants (solve / apply knobs); B = 1: fused kernel variants
BASE = KC(32, 32, 4, 2, True, 4, solve_heads=2, solve_stages=3)  # runs 2-3 of 2026-12-01: the best solve
SPLIT_VARIANTS = {
    "default": None,
    "base": BASE,
}
FUSED_VARIANTS = {
    "default": None,
    "f_s3": KC(32, 32, 4, 3, False),
    "f_s4": KC(32, 32, 4, 4, False),
}
# --fused-sweep (B = 1 tree steps of the engine, N = 64 and 32): tile shapes, warps and stages of the fused kernel
FUSED_SWEEP = {
    "default": None,
    "bk64_w4_s3": KC(32, 64, 4, 3, False),
    "bk64_w8_s3": KC(32, 64, 8, 3, False),
    "bk128_w8_s2": KC(32, 128, 8, 2, False),
    "bk128_w8_s1": KC(32, 128, 8, 1, False),
    "bk32_w8_s3": KC(32, 32, 8, 3, False),
    "bv16_w4_s3": KC(16, 32, 4, 3, False),
    "bv16_bk64_w4_s3": KC(16, 64, 4, 3, False),
    "bv64_w4_s3": KC(64, 32, 4, 3, False),
    "bv64_w8_s3": KC(64, 32, 8, 3, False),
    "words_s3": KC(32, 32, 4, 3, False, word_vectors=True),
    "bk16_w4_s4": KC(32, 16, 4, 4, False),
}
FUSED_SWEEP_SHAPES = [((1, 64), FUSED_SWEEP), ((1, 32), FUSED_SWEEP)]
# --dot16-sweep (bf16 q / k, the model's): K K^T and Q K^T as 16-bit products or on tf32, and the N = 32 candidate
DOT16_FUSED = {
    "default": None,
    "no_dot16": KC(32, 32, 4, 3, False, dot16=False),
    "bk16_w4_s4": KC(32, 16, 4, 4, False),
    "bk16_w4_s4_no_dot16": KC(32, 16, 4, 4, False, dot16=False),
    "bk64_w4_s3": KC(32, 64, 4, 3, False),
}
DOT16_SPLIT = {
    "default": None,
    "no_dot16": BASE._replace(dot16=False),
}
DOT16_SHAPES = [((1, 64), DOT16_FUSED), ((1, 32), DOT16_FUSED), ((1, 16), DOT16_FUSED), ((64, 64), DOT16_SPLIT)]
# --depth-sweep (bf16 q / k): the default launch on tree shapes of growing depth (the doubling's levels)
DEPTH_SHAPES = [((1, N), {"default": None}, kind) for N in (64, 32) for kind in ("star", "eagle", "random", "chain")]
N128_VARIANTS = {
    "default": None,
    "h2_w8": KC(128, 32, 8, 2, True, 8, solve_heads=2),
    "h2_w8_s3": KC(128, 32, 8, 2, True, 8, solve_heads=2, solve_stages=3),
    "h2_w16": KC(128, 32, 8, 2, True, 16, solve_heads=2),
    "h1_w8_s3": KC(128, 32, 8, 2, True, 8, solve_stages=3),
}
N32_VARIANTS = {
    "default": None,
    "h2_w4_s3": KC(64, 32, 4, 2, True, 4, solve_heads=2, solve_stages=3),
}
SHAPES = [((64, 64), SPLIT_VARIANTS), ((1, 64), FUSED_VARIANTS), ((16, 64), SPLIT_VARIANTS),
          ((64, 128), N128_VARIANTS), ((64, 32), N32_VARIANTS), ((1, 128), FUSED_VARIANTS),
          ((1, 32), FUSED_VARIANTS), ((16, 128), N128_VARIANTS)]


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    a = a.double()
    return float((a - ref).norm() / ref.norm()) if bool(torch.isfinite(a).all()) else float("inf")


def variants(mode: str, budget_s: float, shapes: list | None = None, dtype: torch.dtype = torch.float32
             ) -> list[dict]:
    """Every variant: correctness against float64 (first 4 requests, NaN-poisoned outputs), then the whole verify,
    and for split configs the solve and apply kernels alone."""
    import time  # noqa: PLC0415

    from lumotree.optimized import gdn_tree_ref as R  # noqa: PLC0415

    start, rows = time.time(), []
    for entry in shapes or SHAPES:
        (B, N), table = entry[:2]
        kind = entry[2] if len(entry) > 2 else "random"
        if time.time() - start > budget_s:
            break
        x = bench_gdn.make_inputs(B, N, kind, seed=B * 1000 + N + 1, dtype=dtype)
        x["meta"] = G.tree_meta(x["parents"])
        sub = slice(0, min(B, 4))
        ref_o, ref_f = R.gdn_tree_closed_form_ref(*[x[n][sub].double() for n in ("q", "k", "v", "g", "beta")],
                                                  x["pool"].double(), x["slots"][sub], x["parents"][sub],
                                                  use_qk_l2norm=True)
        for name, cfg in table.items():
            if time.time() - start > budget_s:
                rows.append(dict(B=B, N=N, variant=name, skipped="budget"))
                continue
            row = dict(B=B, N=N, kind=kind, max_depth=x["max_depth"], variant=name,
                       config=None if cfg is None else cfg._asdict())
            try:
                out = (torch.full_like(x["v"], float("nan")),
                       torch.full(x["v"].shape, float("nan"), device="cuda"),
                       torch.full(x["g"].shape, float("nan"), device="cuda"),
                       torch.full(x["q"].shape[:3], float("nan"), device="cuda"))
                o, f = G.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], x["pool"], x["slots"],
                                         x["parents"], use_qk_l2norm_in_kernel=True, input_precision=mode,
                                         meta=x["meta"], validate=False, config=cfg, out=out)
                torch.cuda.synchronize()
                row["err_o"], row["err_delta"] = _rel(o[sub], ref_o), _rel(f.delta[sub], ref_f.delta)
                row["verify_us"], _ = bench_gdn.graph_time(lambda cfg=cfg: _verify(x, mode, cfg), rep_ms=60)
                eff = cfg or G.verify_config(B, HV, N, K, V, torch.device("cuda"), H)
                if eff.split:
                    row["solve_us"], _ = bench_gdn.graph_time(
                        _without("_gdn_tree_apply_kernel", lambda cfg=cfg: _verify(x, mode, cfg)), rep_ms=40)
                    row["apply_us"], _ = bench_gdn.graph_time(
                        _without("_gdn_tree_solve_kernel", lambda cfg=cfg: _verify(x, mode, cfg)), rep_ms=40)
            except Exception as exc:  # noqa: BLE001 - record and go on
                row["error"] = f"{type(exc).__name__}: {exc}"[-300:]
            torch.cuda.synchronize()
            rows.append(row)
            print("variant " + "  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                         for k, v in row.items() if k != "config"), flush=True)
        _, factors = _verify(x, mode)
        for name, cfg in COMMIT_VARIANTS.items() if N == 64 and len(entry) == 2 else ():
            row = dict(B=B, N=N, variant="commit_" + name, config=None if cfg is None else cfg._asdict())
            try:
                pool = x["pool"].clone()
                row["commit_us"], _ = bench_gdn.graph_time(
                    lambda cfg=cfg: G.gdn_tree_commit(pool, x["slots"], factors, x["parents"], x["accepted"],
                                                      input_precision=mode, meta=x["meta"], validate=False,
                                                      config=cfg), rep_ms=40)
            except Exception as exc:  # noqa: BLE001
                row["error"] = f"{type(exc).__name__}: {exc}"[-300:]
            rows.append(row)
            print("variant " + "  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                         for k, v in row.items() if k != "config"), flush=True)
        del x, factors
        torch.cuda.empty_cache()
    return rows


# --model-like: the fused kernel as the model launches it (bf16, strided views, cold states), per config
MODEL_LIKE = {
    "default": None,
    "default_hot": None,  # every launch on layer 0's data: its state stays in L2 (as in the isolated benchmarks)
    "default_pointers": None,  # the default without tensor descriptors (KernelConfig.tma off)
    "default_pointers_hot": None,  # the same, every launch on layer 0's data
    "s4": KC(32, 32, 4, 4, False),
    "s2": KC(32, 32, 4, 2, False),
    "bk64_s3": KC(32, 64, 4, 3, False),
    "bk64_s2": KC(32, 64, 4, 2, False),
    "bk16_s4": KC(32, 16, 4, 4, False),
    "bv16_s3": KC(16, 32, 4, 3, False),
    "w8_s3": KC(32, 32, 8, 3, False),
    # second run (after w8_s3 won at N = 64 and bk16_s4 at N = 32 in the first)
    "w8_s2": KC(32, 32, 8, 2, False),
    "w8_s4": KC(32, 32, 8, 4, False),
    "w8_bk64_s3": KC(32, 64, 8, 3, False),
    "w8_bk16_s4": KC(32, 16, 8, 4, False),
    "w8_bv64_s3": KC(64, 32, 8, 3, False),
    "w8_bv16_s3": KC(16, 32, 8, 3, False),
    "bk16_s3": KC(32, 16, 4, 3, False),
    "bk16_s5": KC(32, 16, 4, 5, False),
}


def model_like(budget_s: float, layers: int = 48, nodes=(64, 32, 16), variants=None) -> list[dict]:  # noqa: PLR0915
    """The fused verify as the model's B = 1 tree step runs it: ``layers`` layer copies, each with its own state
    (so every launch reads its ``S0`` from DRAM, as in the model, where the weights stream through L2 between two
    uses of a layer), q / k / v as views of a conv output ``[B, N, 2 H K + HV V]`` and the gates as views of a
    projection ``[B, N, 2 H K + 2 HV V + 2 HV]`` (the model's strides), all launches back to back in one CUDA graph:
    microseconds per launch, each config checked against the per-launch default (bit-identical not required: the
    K chunking changes the sums; relative difference reported). ``variants``: the names of ``MODEL_LIKE`` to run
    (all by default)."""
    import time  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415

    from lumotree.reference.tree import random_parents  # noqa: PLC0415

    start, rows, dev = time.time(), [], torch.device("cuda")
    C = 2 * H * K + HV * V
    for N in nodes:
        gen = torch.Generator(device=dev).manual_seed(N)
        rng = np.random.default_rng(N)
        parents = torch.tensor([random_parents(N, rng)], dtype=torch.int32, device=dev)  # [1, N]
        meta = G.tree_meta(parents)
        conv = torch.randn(layers, 1, N, C, device=dev, generator=gen).bfloat16()  # [G, B, N, C]
        proj = torch.randn(layers, 1, N, C + HV * V + 2 * HV, device=dev, generator=gen).bfloat16()
        pools = torch.randn(layers, 1, HV, K, V, device=dev, generator=gen) * 0.1  # [G, P, HV, K, V]
        A_log = torch.log(torch.empty(HV, device=dev).uniform_(1, 16, generator=gen))
        dt_bias = torch.randn(HV, device=dev, generator=gen) * 0.5
        slots = torch.zeros(1, dtype=torch.int32, device=dev)
        outs = [torch.empty(1, N, HV, V, dtype=torch.bfloat16, device=dev) for _ in range(layers)]
        deltas = torch.empty(layers, 1, N, HV, V, device=dev)
        lgs = torch.empty(layers, 1, N, HV, device=dev)
        krs = torch.empty(layers, 1, N, H, device=dev)

        def step(cfg, conv=conv, proj=proj, pools=pools, N=N, hot=False):
            for g in [0] * layers if hot else range(layers):
                q = conv[g, :, :, : H * K].unflatten(-1, (H, K))
                k = conv[g, :, :, H * K : 2 * H * K].unflatten(-1, (H, K))
                v = conv[g, :, :, 2 * H * K :].unflatten(-1, (HV, V))
                b = proj[g, :, :, C + HV * V : C + HV * V + HV]
                a = proj[g, :, :, C + HV * V + HV :]
                G.gdn_tree_verify_gated(q, k, v, a, b, A_log, dt_bias, pools[g], slots, parents,
                                        input_precision="tf32", meta=meta, validate=False, config=cfg,
                                        out=(outs[g], deltas[g], lgs[g], krs[g]))

        reference = None
        for name, cfg in MODEL_LIKE.items():
            if variants is not None and name not in variants:
                continue
            if name.startswith("default_pointers"):
                cfg = G.verify_config(1, HV, N, K, V, dev, H, "tf32", torch.bfloat16)._replace(tma=False,
                                                                                               solve_tma=False)
            if time.time() - start > budget_s:
                rows.append(dict(N=N, variant=name, skipped="budget"))
                continue
            row = dict(B=1, N=N, layers=layers, variant=name, config=None if cfg is None else cfg._asdict())
            try:
                hot = name.endswith("_hot")
                step(cfg)
                torch.cuda.synchronize()
                got = torch.stack([o.float() for o in outs])
                if reference is None:
                    reference = got.clone()
                row["rel_diff_vs_default"] = _rel(got, reference.double())
                us, _ = bench_gdn.graph_time(lambda cfg=cfg, hot=hot: step(cfg, hot=hot), rep_ms=100)
                row["us_per_launch"] = us / layers
            except Exception as exc:  # noqa: BLE001
                row["error"] = f"{type(exc).__name__}: {exc}"[-300:]
            rows.append(row)
            print("model_like " + "  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                            for k, v in row.items() if k != "config"), flush=True)
        del conv, proj, pools, outs, deltas
        torch.cuda.empty_cache()
    return rows


COMMIT_VARIANTS = {"default": None, "bv32_bk32_w2": KC(32, 32, 2, 1), "bv16_bk128_w4": KC(16, 128, 4, 1),
                   "bv64_bk128_w4_s2": KC(64, 128, 4, 2), "bv128_bk16_w4": KC(128, 16, 4, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ncu", action="store_true", help="one launch of each kernel, for Nsight Compute")
    parser.add_argument("--ncu-small", action="store_true",
                        help="with --ncu: only the fused kernel at B = 1, N = 16, 32, 64")
    parser.add_argument("--mode", default="tf32")
    parser.add_argument("--out", default="gdn_profile.json")
    parser.add_argument("--variants", action="store_true", help="time the launch-config variants of this file")
    parser.add_argument("--fused-sweep", action="store_true",
                        help="with --variants: only the fused kernel's sweep at B = 1 (FUSED_SWEEP)")
    parser.add_argument("--dot16-sweep", action="store_true",
                        help="with --variants: bf16 q / k, the 16-bit Gram products against tf32 (DOT16_SHAPES)")
    parser.add_argument("--depth-sweep", action="store_true",
                        help="with --variants: bf16 q / k, the default launch on trees of growing depth (DEPTH_SHAPES)")
    parser.add_argument("--model-like", action="store_true",
                        help="the fused kernel as the model launches it at B = 1 (cold states, strided views)")
    parser.add_argument("--model-like-nodes", type=int, nargs="+", default=[64, 32, 16])
    parser.add_argument("--model-like-variants", nargs="+", choices=list(MODEL_LIKE),
                        help="with --model-like: these variants only")
    parser.add_argument("--budget-s", type=float, default=200.0)
    args = parser.parse_args()
    if args.model_like:
        rows = model_like(args.budget_s, nodes=tuple(args.model_like_nodes), variants=args.model_like_variants)
        with open(args.out, "w") as fh:
            json.dump(dict(card=torch.cuda.get_device_name(), rows=rows), fh, indent=1)
        return 0
    if args.variants:
        shapes = (FUSED_SWEEP_SHAPES if args.fused_sweep else DOT16_SHAPES if args.dot16_sweep
                  else DEPTH_SHAPES if args.depth_sweep else None)
        dtype = torch.bfloat16 if args.dot16_sweep or args.depth_sweep else torch.float32
        rows = variants(args.mode, args.budget_s, shapes, dtype)
        with open(args.out, "w") as fh:
            json.dump(dict(card=torch.cuda.get_device_name(), mode=args.mode, dtype=str(dtype),
                           disable_mma_v3=os.environ.get("DISABLE_MMA_V3", ""), rows=rows), fh, indent=1)
        return 0
    rows = []
    shapes = ((64, 64), (16, 64), (1, 64)) if not args.ncu else ((64, 64), (1, 64))
    if args.ncu_small:
        shapes = ((1, 16), (1, 32), (1, 64))
    for B, N in shapes:
        x = bench_gdn.make_inputs(B, N, "random", seed=B * 1000 + N)
        x["meta"] = G.tree_meta(x["parents"])
        split = G.verify_config(B, HV, N, K, V, torch.device("cuda"), H)._replace(split=True)
        fused = split._replace(split=False, block_v=64 if B > 1 else 32)
        _, factors = _verify(x, args.mode)

        def commit():
            G.gdn_tree_commit(x["pool"], x["slots"], factors, x["parents"], x["accepted"], input_precision=args.mode,
                              meta=x["meta"], validate=False)

        fns = {
            "verify_default": lambda: _verify(x, args.mode),
            "verify_split": lambda: _verify(x, args.mode, split),
            "solve_only": _without("_gdn_tree_apply_kernel", lambda: _verify(x, args.mode, split)),
            "apply_only": _without("_gdn_tree_solve_kernel", lambda: _verify(x, args.mode, split)),
            "verify_fused": lambda: _verify(x, args.mode, fused),
            "commit": commit,
        }
        if args.ncu:
            for name in ("verify_split", "verify_fused", "commit") if B > 1 else ("verify_fused", "commit"):
                fns[name]()  # compile launch
                torch.cuda.synchronize()
                fns[name]()
                torch.cuda.synchronize()
            continue
        row = dict(B=B, N=N, mode=args.mode, depth=x["max_depth"], split=list(split), fused=list(fused))
        for name, fn in fns.items():
            row[name + "_us"], _ = bench_gdn.graph_time(fn, rep_ms=80)
        rows.append(row)
        print("  ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
        del x
        torch.cuda.empty_cache()
    if not args.ncu:
        with open(args.out, "w") as fh:
            json.dump(dict(card=torch.cuda.get_device_name(), rows=rows), fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
