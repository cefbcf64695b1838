"""Decode projections ``y = x @ w.T`` (M = 1..64 rows, bf16): torch/cuBLAS against :mod:`lumotree.optimized.ops.gemv`.

For every weight shape of the bench model (hidden 2048; the LM head ``[151936, 2048]`` with fp32 output, as the
model's ``(x @ lm_head.T).float()``) and M in ``--rows`` (default {1, 2, 4, 8}; up to 64: tree steps) it

1. checks each variant against ``x.float() @ w.float().T`` (relative L2 error; above 2e-2 a variant is marked bad
   and never "best");
2. times it as a CUDA-graph replay of ``--calls`` (20) back-to-back calls cycling over distinct copies of ``w``
   (at least 120 MB of weights in all, so no call finds its weight in L2), median of ``triton.testing.do_bench``,
   divided by the number of calls;

for torch ``x @ w.T``, ``small_batch_linear`` with its default config and a small sweep (broadcast + sum tiles
block_n in {4, 8, 16, 32} x block_k in {256, 512, 1024}, 4 or 8 warps; five ``tl.dot`` tiles with 2 to 4 stages;
above 8 rows seven wider ``tl.dot`` tiles only;
split-K from the default rule and its neighbours in {1, 2, 4, 8}). Achieved bandwidth = bytes of (w + x + y) / time,
next to the copy bandwidth measured in the same run (a 2 GiB device-to-device copy, bytes read + written / time).
Baselines (torch, default) run first for every case; the sweep gets what is left of a wall-clock budget
(``--budget-s``, default 170 s for the whole run), shared evenly by the cases; configs left when a case's share
runs out are counted as skipped. ``--quick``: torch and the default config only. Exit status 1 if any result is
above the error tolerance.

Tree-step rows: ``--rows 16 32 64 --row-sweep --pdl --torch-variants`` sweeps :data:`ROW_TILES` x
:data:`ROW_SPLITS` with and without TMA (compiled first in parallel worker processes), launched as the model
launches them (PDL), next to cuBLAS without reduced-precision reductions, through cuBLASLt and transposed.

SwiGLU (``--swiglu``): for the gate | up shape ``[11264, 2048]`` (rows interleaved) at each M, the GEMV with SwiGLU
in its epilogue (default config, and the row tiles above 8 rows) beside the plain GEMV followed by the model's
SwiGLU kernel, and cuBLAS + that kernel (checked against ``silu(x g^T) * (x u^T)`` in fp32).

Run (GPU only): ``PYTHONPATH=$PWD python bench/gemv.py --out gemv.json`` (add ``--quick`` for a fast check).
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
import triton
import triton.testing

import worker_pool  # bench/: on sys.path when this file runs as a script
from lumotree.optimized.ops import gemv as G

SHAPES = [(12352, 2048), (2048, 4096), (9216, 2048), (11264, 2048), (2048, 5632), (151936, 2048)]  # (N, K) of w
ROWS = [1, 2, 4, 8]
LM_HEAD_N = 151936
MIN_WEIGHT_BYTES = 120e6  # weights cycled per graph: more than the H200's L2 (50 MB) twice over
REL_TOL = 2e-2
SUM_TILES = [  # (block_n, block_k, num_warps, num_stages), broadcast + tl.sum, most promising first; Triton does not
    # pipeline these loads (no cp.async in the sm_90 build), so num_stages is left at 1
    (16, 512, 4, 1), (8, 512, 4, 1), (16, 256, 4, 1), (32, 256, 8, 1), (16, 1024, 8, 1), (32, 512, 8, 1),
    (8, 256, 4, 1), (4, 512, 4, 1),
]
DOT_TILES = [(32, 256, 4, 3), (64, 128, 4, 4), (32, 512, 4, 2), (16, 256, 4, 2), (32, 128, 4, 4)]  # tl.dot
WIDE_DOT_TILES = [  # tl.dot above 8 rows: wider row blocks (each program re-reads its K-range of x from L2)
    (128, 128, 8, 4), (128, 64, 4, 4), (64, 128, 4, 4), (256, 64, 8, 3), (128, 128, 4, 3), (64, 64, 4, 5),
    (256, 128, 8, 3),
]
SPLITS = [1, 2, 4, 8]
ROW_TILES = [  # --row-sweep (tree steps, 9..64 rows): (block_n, block_k, num_warps, num_stages), each with and
    # without TMA and over ROW_SPLITS
    (128, 128, 8, 4), (128, 64, 4, 4), (64, 128, 4, 4), (64, 256, 4, 3), (256, 64, 8, 3), (128, 256, 8, 2),
    (64, 64, 4, 5),
]
ROW_SPLITS = [1, 2, 4, 6, 8]


def copy_bandwidth(device: torch.device) -> float:
    """Bytes read + written per second of a 2 GiB device-to-device copy."""
    src = torch.empty(2**31, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=20, rep=100, return_mode="median")
    del src, dst
    return 2 * 2**31 / (ms * 1e-3)


def graph_time_us(call, calls: int, warmup_ms: float, rep_ms: float) -> float:
    """Median time of one ``call(i)`` inside a CUDA graph of ``calls`` back-to-back calls (i = 0 .. calls - 1)."""
    for i in range(min(calls, 3)):  # compile, fill the scratch caches (no allocation during capture)
        call(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            call(i)
    ms = triton.testing.do_bench(graph.replay, warmup=warmup_ms, rep=rep_ms, return_mode="median")
    del graph
    return ms * 1e3 / calls


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref).norm() / ref.norm())


def sweep_configs(M: int, N: int, K: int, sms: int, default: G.GemvConfig) -> list[G.GemvConfig]:
    """Candidate configs for one case (default excluded), most promising first, distinct effective splits."""
    m_pad = triton.next_power_of_2(M)
    out, seen = [], {default._replace(split_k=G._split_k_range(K, default.block_k, default.split_k)[0])}
    if M > G.MAX_SUM_ROWS:
        tiles = [(t, True) for t in WIDE_DOT_TILES]
    else:
        tiles = [(t, False) for t in SUM_TILES if m_pad * t[0] * t[1] <= (64 if M <= 2 else 128) * 32 * t[2]]
        tiles += [(t, True) for t in DOT_TILES if M >= 2 or t in DOT_TILES[:2]]
    if M >= 4:  # the dot tiles first: the sum tiles need M_PAD times the registers
        tiles = [t for t in tiles if t[1]] + [t for t in tiles if not t[1]]
    for (block_n, block_k, warps, stages), use_dot in tiles:
        row_blocks = triton.cdiv(N, block_n)
        rule = min(16, triton.cdiv((4 if use_dot else 8) * sms, row_blocks))
        ladder = sorted(set(SPLITS + [rule]))  # the rule's split and its neighbours in {1, 2, 4, 8}
        at = ladder.index(rule)
        splits = [rule] + [s for s in ladder[max(0, at - 1) : at + 2] if s != rule and row_blocks * s <= 32 * sms]
        for split in splits:
            eff = G._split_k_range(K, block_k, split)[0]
            cfg = G.GemvConfig(block_n, block_k, eff, warps, stages, use_dot)
            if cfg not in seen:
                seen.add(cfg)
                out.append(cfg)
    return out


def row_sweep_configs(M: int, N: int, K: int, sms: int) -> list[G.GemvConfig]:
    """``--row-sweep``: every tile of :data:`ROW_TILES` with and without TMA, at each split of :data:`ROW_SPLITS`
    that leaves at most 4 programs per SM and whole, non-empty K-ranges (distinct effective splits)."""
    out = []
    for block_n, block_k, warps, stages in ROW_TILES:
        row_blocks = triton.cdiv(N, block_n)
        splits = sorted({G._split_k_range(K, block_k, s)[0] for s in ROW_SPLITS if row_blocks * s <= 4 * sms})
        for split in splits:
            for tma in (False, True):
                out.append(G.GemvConfig(block_n, block_k, split, warps, stages, True, tma))
    return out


def torch_variants(x: torch.Tensor, ws: list, lm_head: bool) -> dict:
    """cuBLAS through torch, three ways: ``x @ w.T`` with bf16 reduced-precision split-K reductions disallowed,
    the same product through the cuBLASLt backend, and the transposed product ``w @ x.T`` (``[N, M]``)."""

    def no_reduced(i):
        flag = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        try:
            y = x @ ws[i % len(ws)].T  # [M, N]
        finally:
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = flag
        return y.float() if lm_head else y

    def lt(i):
        lib = torch.backends.cuda.preferred_blas_library()
        torch.backends.cuda.preferred_blas_library("cublaslt")
        try:
            y = x @ ws[i % len(ws)].T  # [M, N]
        finally:
            torch.backends.cuda.preferred_blas_library(lib)
        return y.float() if lm_head else y

    def transposed(i):
        y = (ws[i % len(ws)] @ x.T).T  # [M, N] (a transposed view)
        return y.float() if lm_head else y

    return {"torch_no_reduced": no_reduced, "torch_cublaslt": lt, "torch_transposed": transposed}


def _warm(job: tuple) -> str:
    """Worker of :func:`precompile`: one call of each config on one shape (fills the Triton cache)."""
    return worker_pool.warm_calls(_warm_calls(*job))


def _warm_calls(N: int, K: int, M: int, lm_head: bool, configs: list, pdl: bool):
    device = torch.device("cuda")
    w = torch.randn(N, K, device=device).to(torch.bfloat16)
    x = torch.randn(M, K, device=device).to(torch.bfloat16)
    for cfg in configs:
        yield f"{N}x{K} M={M} {cfg}", lambda cfg=cfg: G.small_batch_linear(
            x, w, out_dtype=torch.float32 if lm_head else None, config=G.GemvConfig(*cfg), pdl=pdl)


def precompile(jobs: list, timeout_s: float) -> dict:
    """Compile the configs of ``jobs`` (``(N, K, M, lm_head, configs, pdl)``) in parallel worker processes."""
    chunks = []
    for N, K, M, lm_head, configs, pdl in jobs:  # a few configs per worker task
        for i in range(0, len(configs), 6):
            chunks.append((N, K, M, lm_head, [tuple(c) for c in configs[i : i + 6]], pdl))
    seconds, results = worker_pool.run_tasks(_warm, chunks, timeout_s)
    return {"seconds": seconds, "tasks": len(chunks),
            "status": {"ok": results.count("ok"), "other": [r for r in results if r != "ok"]}}


def measure(call, calls: int, moved: float, ref: torch.Tensor, **extra) -> dict:
    """Check ``call(0)`` against ``ref`` and time ``call`` (see :func:`graph_time_us`); errors are recorded."""
    try:
        err = rel_err(call(0), ref)
        us = graph_time_us(call, calls, warmup_ms=5.0, rep_ms=25.0 if moved < 200e6 else 60.0)
    except Exception as e:  # a config that fails to compile or launch is a result too
        return dict(extra, error=repr(e)[:300])
    return dict(extra, us=us, TBps=moved / (us * 1e-6) / 1e12, rel_err=err, ok=err < REL_TOL)


def print_table(rows: list[dict], copy_bw: float) -> None:
    print(f"\ncopy bandwidth {copy_bw / 1e12:.2f} TB/s; bandwidth = bytes(w + x + y) / time; speedup = torch / ours")
    head = (f"{'N x K':>12} {'M':>2} | {'torch us':>8} {'TB/s':>5} | {'default us':>10} {'TB/s':>5} {'speedup':>7} | "
            f"{'best us':>8} {'TB/s':>5} {'speedup':>7} {'copy %':>6} | best (bn, bk, split, warps, stages, dot)"
            f" | rel err torch / default / best")
    print(head + "\n" + "-" * len(head))

    def f(r: dict, key: str, fmt: str) -> str:
        return format(r[key], fmt) if key in r else "-"

    for row in rows:
        t, d, b = row["torch"], row["default"], row["best"] or {}
        sp_d = f"{t['us'] / d['us']:.2f}" if "us" in t and "us" in d else "-"
        sp_b = f"{t['us'] / b['us']:.2f}" if "us" in t and "us" in b else "-"
        copy_pct = f"{100 * b['TBps'] * 1e12 / copy_bw:.0f}" if "TBps" in b else "-"
        print(f"{row['N']:>6} x {row['K']:<4} {row['M']:>2} | {f(t, 'us', '8.1f')} {f(t, 'TBps', '5.2f')} | "
              f"{f(d, 'us', '10.1f')} {f(d, 'TBps', '5.2f')} {sp_d:>7} | {f(b, 'us', '8.1f')} {f(b, 'TBps', '5.2f')} "
              f"{sp_b:>7} {copy_pct:>6} | {b.get('config', '-')} | {f(t, 'rel_err', '.1e')} / "
              f"{f(d, 'rel_err', '.1e')} / {f(b, 'rel_err', '.1e')}")


def swiglu_forms(args, device: torch.device, sms: int) -> int:
    """``--swiglu``: the epilogue form against GEMV + SwiGLU kernel and cuBLAS + SwiGLU kernel, per row count."""
    from lumotree.optimized.model.kernels import silu_mul

    N, K = 11264, 2048
    gen = torch.Generator(device=device).manual_seed(0)
    ws = [torch.randn(N, K, generator=gen, device=device).to(torch.bfloat16)
          for _ in range(max(1, math.ceil(MIN_WEIGHT_BYTES / (N * K * 2))))]
    rows, bad = [], 0
    for M in args.rows:
        x = torch.randn(M, K, generator=gen, device=device).to(torch.bfloat16)  # [M, K]
        gu = x.float() @ ws[0].float().T  # [M, N] fp32, interleaved pairs
        ref = torch.nn.functional.silu(gu[:, 0::2]) * gu[:, 1::2]  # [M, N / 2]
        moved = N * K * 2 + M * K * 2 + M * N  # w + x + y (half the columns)
        forms = {
            "gemv alone": lambda i, x=x: G.small_batch_linear(x, ws[i % len(ws)], pdl=args.pdl),
            "cublas+kernel": lambda i, x=x: silu_mul(x @ ws[i % len(ws)].T),
            "gemv+kernel": lambda i, x=x: silu_mul(G.small_batch_linear(x, ws[i % len(ws)], pdl=args.pdl)),
            "epilogue": lambda i, x=x: G.small_batch_linear(x, ws[i % len(ws)], swiglu=True, pdl=args.pdl),
        }
        if M > G.MAX_SUM_ROWS:
            for cfg in row_sweep_configs(M, N, K, sms):
                if not cfg.tma and cfg.split_k == 1:
                    forms[f"epilogue {list(cfg)[:5]}"] = (lambda i, x=x, cfg=cfg: G.small_batch_linear(
                        x, ws[i % len(ws)], swiglu=True, pdl=args.pdl, config=cfg))
        row = {"M": M, "N": N, "K": K, "default": list(G.gemv_config(M, N, K, device))}
        for name, call in forms.items():
            row[name] = measure(call, args.calls, moved, gu if name == "gemv alone" else ref)
            bad += row[name].get("ok") is False
        best = min((n for n in forms if n.startswith("epilogue ") and row[n].get("ok")), default=None,
                   key=lambda n: row[n]["us"])
        print(f"M={M:>2}: " + ", ".join(f"{n} {row[n].get('us', float('nan')):.1f}" for n in
                                         ("gemv alone", "cublas+kernel", "gemv+kernel", "epilogue")) +
              (f", best epilogue tile {best} {row[best]['us']:.1f}" if best else "") + " us", flush=True)
        rows.append(row)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(dict(device=torch.cuda.get_device_name(device), triton=triton.__version__, rows=rows), fh,
                      indent=1)
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--quick", action="store_true", help="torch and the default config only (no sweep)")
    ap.add_argument("--rows", type=int, nargs="+", default=ROWS, help=f"values of M (default {ROWS}; at most "
                    f"{G.MAX_ROWS})")
    ap.add_argument("--calls", type=int, default=20, help="calls per CUDA graph (default 20)")
    ap.add_argument("--budget-s", type=float, default=170.0,
                    help="wall-clock budget of the whole run; the sweep gets what the baselines leave (default 170)")
    ap.add_argument("--pdl", action="store_true", help="launch ours as programmatic dependent launches (as the "
                    "model does)")
    ap.add_argument("--row-sweep", action="store_true", help="above 8 rows sweep ROW_TILES x ROW_SPLITS with and "
                    "without TMA (compiled first in parallel processes) instead of the wide dot tiles")
    ap.add_argument("--torch-variants", action="store_true", help="also time cuBLAS without bf16 reduced-precision "
                    "reductions, through cuBLASLt and as the transposed product")
    ap.add_argument("--shapes", nargs="+", default=None, help="only these N x K shapes, e.g. 2048x4096")
    ap.add_argument("--swiglu", action="store_true", help="only the gate | up SwiGLU forms (see the docstring)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/gemv.py needs a CUDA GPU")
    start = time.perf_counter()
    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    if args.swiglu:
        return swiglu_forms(args, device, sms)
    copy_bw = copy_bandwidth(device)
    print(f"{torch.cuda.get_device_name(device)}: {sms} SMs, copy bandwidth {copy_bw / 1e12:.2f} TB/s "
          f"(read + write), torch {torch.__version__}, triton {triton.__version__}", flush=True)
    gen = torch.Generator(device=device).manual_seed(0)
    weights = {}  # (N, K) -> copies of w, all kept (about 1.4 GB)
    shapes = SHAPES if not args.shapes else [tuple(int(v) for v in t.split("x")) for t in args.shapes]
    if args.row_sweep and not args.quick:
        jobs = [(N, K, M, N == LM_HEAD_N, row_sweep_configs(M, N, K, sms), args.pdl)
                for N, K in shapes for M in args.rows if M > G.MAX_SUM_ROWS]
        compiled = precompile(jobs, timeout_s=0.5 * args.budget_s)
        print("precompile:", json.dumps(compiled)[:300], flush=True)
    for N, K in shapes:
        copies = max(1, math.ceil(MIN_WEIGHT_BYTES / (N * K * 2)))
        weights[N, K] = [torch.randn(N, K, generator=gen, device=device).to(torch.bfloat16) for _ in range(copies)]

    cases = []  # (row, calls of ours with a config, reference)
    for (N, K), ws in weights.items():  # baselines: torch and the default config, every case
        for M in args.rows:
            lm_head = N == LM_HEAD_N
            out_dtype = torch.float32 if lm_head else torch.bfloat16
            x = torch.randn(M, K, generator=gen, device=device).to(torch.bfloat16)  # [M, K]
            ref = x.float() @ ws[0].float().T  # [M, N] float32 oracle
            moved = N * K * 2 + M * K * 2 + M * N * out_dtype.itemsize  # bytes of w + x + y per call

            def torch_call(i, x=x, ws=ws, lm_head=lm_head):
                y = x @ ws[i % len(ws)].T  # [M, N] bf16, as the model computes it
                return y.float() if lm_head else y

            def ours(cfg, x=x, ws=ws, out_dtype=out_dtype):
                return lambda i: G.small_batch_linear(x, ws[i % len(ws)], out_dtype=out_dtype, config=cfg,
                                                      pdl=args.pdl)

            default = G.gemv_config(M, N, K, device)
            default = default._replace(split_k=G._split_k_range(K, default.block_k, default.split_k)[0])
            row = dict(N=N, K=K, M=M, bytes=moved, weight_copies=len(ws), out_dtype=str(out_dtype), skipped=0)
            row["torch"] = measure(torch_call, args.calls, moved, ref)
            if args.torch_variants:
                for name, call in torch_variants(x, ws, lm_head).items():
                    row[name] = measure(call, args.calls, moved, ref)
                print("   ", ", ".join(f"{n} {row[n].get('us', float('nan')):.1f}" for n in row if n.startswith(
                    "torch_")), flush=True)
            row["default"] = measure(ours(None), args.calls, moved, ref, config=list(default))
            row["sweep"] = []
            cases.append((row, ours, ref, default))
            print(f"  {N:>6} x {K:<4} M={M}: torch {row['torch'].get('us', float('nan')):7.1f} us, default "
                  f"{row['default'].get('us', float('nan')):7.1f} us", flush=True)

    if not args.quick:  # the sweep: the remaining budget shared evenly by the cases left
        for i, (row, ours, ref, default) in enumerate(cases):
            share = max(0.0, args.budget_s - (time.perf_counter() - start)) / (len(cases) - i)
            case_start = time.perf_counter()
            use_rows = args.row_sweep and row["M"] > G.MAX_SUM_ROWS
            configs = (row_sweep_configs(row["M"], row["N"], row["K"], sms) if use_rows
                       else sweep_configs(row["M"], row["N"], row["K"], sms, default))
            for cfg in configs:
                if time.perf_counter() - case_start > share:
                    row["skipped"] += 1
                    continue
                row["sweep"].append(measure(ours(cfg), args.calls, row["bytes"], ref, config=list(cfg)))
            print(f"  swept {row['N']:>6} x {row['K']:<4} M={row['M']}: {len(row['sweep'])} configs, "
                  f"{row['skipped']} skipped", flush=True)

    rows = [c[0] for c in cases]
    for row in rows:
        good = [r for r in [row["default"]] + row["sweep"] if r.get("ok")]
        row["best"] = min(good, key=lambda r: r["us"]) if good else None
    print_table(rows, copy_bw)
    if args.torch_variants or args.row_sweep:  # the sweep's best with and without TMA, the cuBLAS variants
        print("\nN x K M | torch | no-reduced / cublaslt / transposed | best per-thread loads | best TMA (us, config)")
        for row in rows:
            good = [r for r in row["sweep"] if r.get("ok")]
            by = {t: min((r for r in good if len(r["config"]) > 6 and r["config"][6] == t), key=lambda r: r["us"],
                         default=None) for t in (False, True)}
            tv = " / ".join(f"{row[n]['us']:.1f}" if "us" in row.get(n, {}) else "-"
                            for n in ("torch_no_reduced", "torch_cublaslt", "torch_transposed"))
            fmt = [f"{b['us']:.1f} {b['config']}" if b else "-" for b in (by[False], by[True])]
            print(f"{row['N']}x{row['K']} {row['M']} | {row['torch'].get('us', float('nan')):.1f} | {tv} | "
                  f"{fmt[0]} | {fmt[1]}")
    results = [v for r in rows for v in [r["torch"], r["default"]] + r["sweep"]]
    bad = [(r["N"], r["K"], r["M"], v.get("config")) for r in rows for v in [r["torch"], r["default"]] + r["sweep"]
           if v.get("ok") is False]
    errors = sum("error" in v for v in results)
    skipped = sum(r["skipped"] for r in rows)
    elapsed = time.perf_counter() - start
    print(f"\n{len(bad)} results above rel err {REL_TOL}: {bad}; {errors} errors; {skipped} sweep configs skipped "
          f"(budget); {elapsed:.0f} s")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(dict(device=torch.cuda.get_device_name(device), sms=sms, torch=torch.__version__,
                           triton=triton.__version__, copy_bandwidth_Bps=copy_bw, calls_per_graph=args.calls,
                           quick=args.quick, rel_tol=REL_TOL, elapsed_s=elapsed, skipped=skipped, rows=rows),
                      fh, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
