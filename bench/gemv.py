"""Decode projections ``y = x @ w.T`` (M = 1..64 rows, bf16): torch/cuBLAS against :mod:`lumotree.optimized.gemv`.

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

from lumotree.optimized import gemv as G

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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--quick", action="store_true", help="torch and the default config only (no sweep)")
    ap.add_argument("--rows", type=int, nargs="+", default=ROWS, help=f"values of M (default {ROWS}; at most "
                    f"{G.MAX_ROWS})")
    ap.add_argument("--calls", type=int, default=20, help="calls per CUDA graph (default 20)")
    ap.add_argument("--budget-s", type=float, default=170.0,
                    help="wall-clock budget of the whole run; the sweep gets what the baselines leave (default 170)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/gemv.py needs a CUDA GPU")
    start = time.perf_counter()
    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    copy_bw = copy_bandwidth(device)
    print(f"{torch.cuda.get_device_name(device)}: {sms} SMs, copy bandwidth {copy_bw / 1e12:.2f} TB/s "
          f"(read + write), torch {torch.__version__}, triton {triton.__version__}", flush=True)
    gen = torch.Generator(device=device).manual_seed(0)
    weights = {}  # (N, K) -> copies of w, all kept (about 1.4 GB)
    for N, K in SHAPES:
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
                return lambda i: G.small_batch_linear(x, ws[i % len(ws)], out_dtype=out_dtype, config=cfg)

            default = G.gemv_config(M, N, K, device)
            default = default._replace(split_k=G._split_k_range(K, default.block_k, default.split_k)[0])
            row = dict(N=N, K=K, M=M, bytes=moved, weight_copies=len(ws), out_dtype=str(out_dtype), skipped=0)
            row["torch"] = measure(torch_call, args.calls, moved, ref)
            row["default"] = measure(ours(None), args.calls, moved, ref, config=list(default))
            row["sweep"] = []
            cases.append((row, ours, ref, default))
            print(f"  {N:>6} x {K:<4} M={M}: torch {row['torch'].get('us', float('nan')):7.1f} us, default "
                  f"{row['default'].get('us', float('nan')):7.1f} us", flush=True)

    if not args.quick:  # the sweep: the remaining budget shared evenly by the cases left
        for i, (row, ours, ref, default) in enumerate(cases):
            share = max(0.0, args.budget_s - (time.perf_counter() - start)) / (len(cases) - i)
            case_start = time.perf_counter()
            for cfg in sweep_configs(row["M"], row["N"], row["K"], sms, default):
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
