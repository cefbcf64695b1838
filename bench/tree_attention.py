"""Benchmark: tree attention at Qwen3-Next attention shapes (16 q heads, 2 kv heads, head_dim 256, bf16), one GPU.

For every (B, L = committed KV length, N = tree nodes) it times, with CUDA-graph replay and the median of
``triton.testing.do_bench``:

- ``ours``: :func:`lumotree.optimized.ops.tree_attention.tree_attention` (gate fused), best of a small config sweep, and
  the default config (``ours_default``);
- ``decode1``: one single-query decode per request over the same KV (torch SDPA, ``enable_gqa``), the target's unit;
- ``ours_decode1``: our kernel on a one-node tree (the optimized model's decode attention);
- ``dense``: torch SDPA over prefix + tree with a dense boolean tree mask;
- ``pernode``: N single-query SDPA decodes per request, each with its mask row (skipped when huge);
- ``floor``: K and V read once at the copy bandwidth measured in the same run; ``flop_floor``: the QK^T and PV
  matrix work at the bf16 matrix rate measured in the same run.

Writes JSON (``--out``) and prints a table. Needs a CUDA GPU. Run: ``python bench/tree_attention.py --out r.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
import torch
import torch.nn.functional as F
import triton

from lumotree.reference.tree import random_parents
from lumotree.optimized.ops import tree_attention as ta
from lumotree.optimized.ops.tree_meta import tree_metadata

HQ, HKV, D = 16, 2, 256
DEVICE = "cuda"
# (block_m, block_n, num_warps, num_stages): the configs that compile for sm_90 without register spills or with few
# (a cuobjdump resource report of each), plus the previous sweep's winners
CONFIGS = [
    (128, 64, 8, 2),
    (128, 32, 8, 3),
    (64, 64, 8, 2),
    (64, 32, 8, 3),
]
DECODE_CONFIGS = [(16, 64, 4, 3), (16, 32, 4, 4), (16, 64, 4, 2)]
WAVES = (1.0, 2.0)
DECODE_WAVES = (1.0, 2.0, 4.0)




def graph_time(fn, rep_ms: int = 60) -> float:
    """Median microseconds of a CUDA-graph replay of ``fn`` (falls back to eager if capture fails)."""
    fn()
    torch.cuda.synchronize()
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        run = graph.replay
    except Exception as e:  # pragma: no cover - capture failure is reported, not hidden
        print("graph capture failed:", repr(e)[:200])
        run = fn
    return triton.testing.do_bench(run, warmup=10, rep=rep_ms, return_mode="median") * 1e3


def measure_ceilings() -> tuple[float, float]:
    """(copy bandwidth in bytes/s counting read + write, bf16 matmul FLOP/s) measured now."""
    x = torch.empty(2 * 1024**3 // 2, dtype=torch.bfloat16, device="cuda").normal_()
    y = torch.empty_like(x)
    t = triton.testing.do_bench(lambda: y.copy_(x), warmup=20, rep=200, return_mode="median") * 1e-3
    bw = 2 * x.numel() * 2 / t
    del x, y
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    t = triton.testing.do_bench(lambda: a @ b, warmup=20, rep=200, return_mode="median") * 1e-3
    return bw, 2 * 8192**3 / t


def run_point(B: int, L: int, N: int, rng: np.random.Generator, bw: float, flops: float, configs: list,
              decode_cache: dict, compile_only: bool = False) -> dict:
    dev = DEVICE
    C = L + N
    k_cache = torch.randn(B, HKV, C, D, device=dev, dtype=torch.bfloat16)  # [P=B, HKV, C, D]
    v_cache = torch.randn(B, HKV, C, D, device=dev, dtype=torch.bfloat16)
    slots = torch.arange(B, dtype=torch.int32, device=dev)
    lens = torch.full((B,), L, dtype=torch.int32, device=dev)
    parents = torch.tensor([random_parents(N, rng) for _ in range(B)], dtype=torch.int32, device=dev)  # [B, N]
    meta = tree_metadata(parents)
    q = torch.randn(B, N, HQ, D, device=dev, dtype=torch.bfloat16)
    gate = torch.randn(B, N, HQ, D, device=dev, dtype=torch.bfloat16)
    out = torch.empty_like(q)
    row = {"B": B, "L": L, "N": N}

    # dense mask over prefix + tree: [B, 1, N, L + N]
    words = meta.words.to(torch.int64) & 0xFFFFFFFF  # [B, N, W]
    j = torch.arange(N, device=dev)
    tree_mask = ((words[:, :, j // 32] >> (j % 32)) & 1).bool()  # [B, N, N]
    mask = torch.cat([torch.ones(B, N, L, dtype=torch.bool, device=dev), tree_mask], dim=2)[:, None]
    qt = q.transpose(1, 2)  # [B, HQ, N, D]

    def dense():
        o = F.scaled_dot_product_attention(qt, k_cache, v_cache, attn_mask=mask, enable_gqa=True)
        return o.transpose(1, 2) * torch.sigmoid(gate)

    if compile_only:  # warm the Triton cache for a later timing run (same shapes, so the same specialisations)
        q1, g1 = q[:, :1].contiguous(), gate[:, :1].contiguous()
        meta1 = tree_metadata(torch.full((B, 1), -1, dtype=torch.int32, device=dev))
        runs = [(q, gate, meta.words, cfg, waves, 256) for cfg in configs for waves in WAVES]
        runs += [(q1, g1, meta1.words, cfg, waves, cfg[1]) for cfg in DECODE_CONFIGS for waves in DECODE_WAVES]
        for qq, gg, words, (bm, bn, nw, ns), waves, min_chunk in runs:
            rb = triton.cdiv(qq.shape[1], bm // (HQ // HKV))
            splits = ta.choose_num_splits(B, HKV, rb, L, torch.device(dev), block_n=bn, waves=waves,
                                          min_chunk=min_chunk)
            ta.tree_attention(qq, k_cache, v_cache, slots, lens, words, gate=gg, num_splits=splits,
                              launch=ta.AttentionLaunch(bm, bn, nw, ns), validate=False)
        for qq, gg, words in ((q, gate, meta.words), (q1, g1, meta1.words)):
            ta.tree_attention(qq, k_cache, v_cache, slots, lens, words, gate=gg, max_len=L, validate=False)
        torch.cuda.synchronize()
        return row

    # correctness of ours against SDPA in float32 on the same bf16 inputs (two requests keep memory small)
    nb = min(B, 2)
    ref = F.scaled_dot_product_attention(
        qt[:nb].float(), k_cache[:nb].float(), v_cache[:nb].float(), attn_mask=mask[:nb], enable_gqa=True
    ).transpose(1, 2) * torch.sigmoid(gate[:nb].float())
    got = ta.tree_attention(q, k_cache, v_cache, slots, lens, meta.words, gate=gate)[:nb].float()
    row["rel_err"] = float((got - ref).norm() / ref.norm())

    best = None
    for bm, bn, nw, ns in configs:
        for waves in WAVES:
            row_blocks = triton.cdiv(N, bm // (HQ // HKV))
            splits = ta.choose_num_splits(B, HKV, row_blocks, L, torch.device(dev), block_n=bn, waves=waves)
            fn = lambda: ta.tree_attention(  # noqa: E731
                q, k_cache, v_cache, slots, lens, meta.words, gate=gate, out=out, num_splits=splits,
                launch=ta.AttentionLaunch(bm, bn, nw, ns), validate=False)
            try:
                t = graph_time(fn, rep_ms=20)
            except Exception as e:  # a config that does not compile (shared memory) is skipped, not fatal
                print(f"config {(bm, bn, nw, ns)} failed: {repr(e)[:160]}")
                continue
            if best is None or t < best[0]:
                best = (t, (bm, bn, nw, ns, splits))
    row["ours_us"], row["ours_cfg"] = best
    row["ours_default_cfg"] = ta.default_launch(B, N, HQ, HKV, D, L, torch.device(dev))
    row["ours_default_us"] = graph_time(lambda: ta.tree_attention(
        q, k_cache, v_cache, slots, lens, meta.words, gate=gate, out=out, max_len=L, validate=False))


    # decode (does not depend on N): one query per request over the committed KV plus its own token
    if (B, L) not in decode_cache:
        q1 = q[:, :1].contiguous()
        q1t = q1.transpose(1, 2)
        kd, vd = k_cache[:, :, : L + 1], v_cache[:, :, : L + 1]
        dec = {"decode1_us": graph_time(lambda: F.scaled_dot_product_attention(q1t, kd, vd, enable_gqa=True))}
        meta1 = tree_metadata(torch.full((B, 1), -1, dtype=torch.int32, device=dev))
        g1 = gate[:, :1].contiguous()
        out1 = torch.empty_like(q1)
        best1 = None
        for bm, bn, nw, ns in DECODE_CONFIGS:
            for waves in DECODE_WAVES:
                splits = ta.choose_num_splits(B, HKV, 1, L, torch.device(dev), block_n=bn, waves=waves,
                                              min_chunk=bn)
                fn = lambda: ta.tree_attention(  # noqa: E731
                    q1, k_cache, v_cache, slots, lens, meta1.words, gate=g1, out=out1, num_splits=splits,
                    launch=ta.AttentionLaunch(bm, bn, nw, ns), validate=False)
                t = graph_time(fn, rep_ms=20)
                if best1 is None or t < best1[0]:
                    best1 = (t, (bm, bn, nw, ns, splits))
        dec["ours_decode1_us"], dec["ours_decode1_cfg"] = best1
        dec["ours_decode1_default_cfg"] = ta.default_launch(B, 1, HQ, HKV, D, L, torch.device(dev))
        dec["ours_decode1_default_us"] = graph_time(lambda: ta.tree_attention(
            q1, k_cache, v_cache, slots, lens, meta1.words, gate=g1, out=out1, max_len=L, validate=False))
        decode_cache[(B, L)] = dec
    row.update(decode_cache[(B, L)])

    row["dense_us"] = graph_time(dense) if B * N * (L + N) * HQ * 4 < 16 * 1024**3 else None
    if N * B * L <= 64 * 16 * 8192:
        def pernode():
            for i in range(N):
                F.scaled_dot_product_attention(qt[:, :, i : i + 1], k_cache, v_cache, attn_mask=mask[:, :, i : i + 1],
                                               enable_gqa=True)
        row["pernode_us"] = graph_time(pernode)
    else:
        row["pernode_us"] = None
    del ref, got
    kv_bytes = 2 * B * HKV * (L + N) * D * 2
    io_bytes = 3 * B * N * HQ * D * 2  # q, gate read; o written
    row["floor_us"] = (kv_bytes + io_bytes) / bw * 1e6  # as the anchors: bytes moved over the copy rate
    row["flop_floor_us"] = 4 * B * N * HQ * (L + N / 2) * D / flops * 1e6
    row["ratio_vs_decode1"] = row["ours_us"] / row["decode1_us"]
    row["ratio_vs_dense"] = row["ours_us"] / row["dense_us"] if row["dense_us"] else None
    del k_cache, v_cache
    torch.cuda.empty_cache()
    return row


def plot(json_path: str, png_path: str, length: int = 8192) -> None:
    """Times against N at one KV length, one panel per batch size (log scale), from a result JSON."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(json_path) as f:
        rows = [r for r in json.load(f)["rows"] if r["L"] == length]
    batches = sorted({r["B"] for r in rows})
    fig, axes = plt.subplots(1, len(batches), figsize=(4.2 * len(batches), 3.6), squeeze=False)
    series = [("ours_us", "tree attention (ours)", "C0", "o-"), ("dense_us", "SDPA, dense tree mask", "C3", "s--"),
              ("pernode_us", "N single-query SDPA decodes", "C1", "^--"), ("decode1_us", "one decode (SDPA)", "k", ":"),
              ("flop_floor_us", "matmul floor", "C2", "-."), ("floor_us", "memory floor", "0.5", "-.")]
    for ax, B in zip(axes[0], batches):
        pts = sorted((r for r in rows if r["B"] == B), key=lambda r: r["N"])
        for key, label, color, style in series:
            xs = [r["N"] for r in pts if r.get(key)]
            ax.plot(xs, [r[key] for r in pts if r.get(key)], style, color=color, label=label, markersize=4)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks([r["N"] for r in pts], [str(r["N"]) for r in pts])
        ax.set_title(f"B = {B}, KV length {length}")
        ax.set_xlabel("tree nodes N")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("microseconds (CUDA-graph replay, median)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(series), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(png_path, dpi=110)


def diagnose(rng: np.random.Generator, compile_only: bool = False) -> dict:
    """Where the time of B = 1, N = 64 over 8k goes: per-kernel GPU time (torch profiler, mean of 20 eager calls)
    of the default launch and of variants (other split counts, the tree part alone, one split), and
    the floor of a CUDA-graph replay measured as the benchmark measures (one tiny kernel)."""
    from torch.profiler import ProfilerActivity, profile

    B, L, N, dev = 1, 8192, 64, DEVICE
    k_cache = torch.randn(B, HKV, L + N, D, device=dev, dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    slots = torch.zeros(B, dtype=torch.int32, device=dev)
    lens = torch.full((B,), L, dtype=torch.int32, device=dev)
    words = tree_metadata(torch.tensor([random_parents(N, rng)], dtype=torch.int32, device=dev)).words
    q = torch.randn(B, N, HQ, D, device=dev, dtype=torch.bfloat16)
    gate = torch.randn_like(q)
    words1 = torch.ones((B, 1, 1), dtype=torch.int32, device=dev)
    call = dict(gate=gate, validate=False)
    variants = {
        "default": lambda: ta.tree_attention(q, k_cache, v_cache, slots, lens, words, max_len=L, **call),
        "splits_8": lambda: ta.tree_attention(q, k_cache, v_cache, slots, lens, words, num_splits=8, **call),
        "splits_32": lambda: ta.tree_attention(q, k_cache, v_cache, slots, lens, words, num_splits=32, **call),
        "tree_only_L0": lambda: ta.tree_attention(q, k_cache, v_cache, slots, lens * 0, words, num_splits=1, **call),
        "one_split_L512": lambda: ta.tree_attention(q, k_cache, v_cache, slots, lens * 0 + 512, words, num_splits=1,
                                                    **call),
        "decode_default": lambda: ta.tree_attention(q[:, :1].contiguous(), k_cache, v_cache, slots, lens, words1,
                                                    gate=gate[:, :1].contiguous(), max_len=L, validate=False),
    }
    out: dict = {}
    if compile_only:
        for fn in variants.values():
            fn()
        torch.cuda.synchronize()
        return out
    for name, fn in variants.items():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
        times = {}
        for evt in prof.key_averages():
            us = getattr(evt, "self_device_time_total", None)
            us = evt.self_cuda_time_total if us is None else us
            if us > 0:
                times[evt.key[:60]] = float(us) / 20
        out[name] = times
        print(name, {k: round(v, 1) for k, v in times.items()}, flush=True)
    x = torch.zeros(1, device=dev)
    out["replay_floor_us"] = graph_time(lambda: x.add_(1.0))
    print("replay floor (one tiny kernel):", round(out["replay_floor_us"], 1), "us", flush=True)
    return out


def run_points(points: list[str], out: str, rng: np.random.Generator, compile_only: bool,
               diag: bool = False) -> int:
    """Explicit points ``B:L:N`` (full config sweep) or ``B:L:N:d`` (default config and its split-count sweep)."""
    bw, flops = (1.0, 1.0) if compile_only else measure_ceilings()
    if not compile_only:
        print(f"{torch.cuda.get_device_name()}  copy bw {bw / 1e12:.2f} TB/s  bf16 matmul {flops / 1e12:.0f} TFLOP/s")
    rows, decode_cache, t0 = [], {}, time.time()
    extra = {}
    if diag:
        try:
            extra["diagnose"] = diagnose(rng, compile_only)
        except Exception as e:  # pragma: no cover - reported, not hidden
            extra["diagnose"] = {"error": repr(e)}
            print("diagnose failed:", repr(e), flush=True)
    for point in points:
        parts = point.split(":")
        B, L, N = (int(x) for x in parts[:3])
        default_only = len(parts) > 3 and parts[3] == "d"
        configs = [tuple(ta.default_launch(B, N, HQ, HKV, D, L, torch.device(DEVICE))[:4])] if default_only else CONFIGS
        row = run_point(B, L, N, rng, bw, flops, configs, decode_cache, compile_only=compile_only)
        if compile_only:
            continue
        rows.append(row)
        print(json.dumps(row), flush=True)
        result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                  "copy_bw": bw, "bf16_flops": flops, "seconds": time.time() - t0, "rows": rows, **extra}
        with open(out, "w") as f:  # after every point: a run cut short keeps what it measured
            json.dump(result, f, indent=1)
    if not compile_only:
        print_table(rows)
    return 0


def print_table(rows: list[dict]) -> None:
    hdr = ("B", "L", "N", "ours", "default", "decode1", "ours_dec1", "dense", "pernode", "floor", "flopfl", "x_dec1",
           "x_dense", "err")
    print(" ".join(f"{h:>9}" for h in hdr))
    for r in rows:
        vals = [r["B"], r["L"], r["N"], r["ours_us"], r["ours_default_us"], r["decode1_us"], r["ours_decode1_us"],
                r["dense_us"], r["pernode_us"], r["floor_us"], r["flop_floor_us"], r["ratio_vs_decode1"],
                r["ratio_vs_dense"], r["rel_err"]]
        print(" ".join(f"{v:>9.3g}" if isinstance(v, float) else f"{str(v):>9}" for v in vals))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tree_attention_bench.json")
    ap.add_argument("--plot", nargs=2, metavar=("JSON", "PNG"), help="only draw the plot of a result JSON (no GPU)")
    ap.add_argument("--B", type=int, nargs="*", default=[1, 16, 64])
    ap.add_argument("--L", type=int, nargs="*", default=[1024, 8192, 32768])
    ap.add_argument("--N", type=int, nargs="*", default=[8, 32, 64, 128])
    ap.add_argument("--points", nargs="*", metavar="B:L:N[:d]",
                    help="time only these points (instead of the grid): B:L:N sweeps the configs, B:L:N:d times the "
                         "default config (and its split counts)")
    ap.add_argument("--no-sweep", action="store_true", help="time the first config only")
    ap.add_argument("--compile-only", action="store_true", help="run every config once (warm the Triton cache)")
    ap.add_argument("--diagnose", action="store_true", help="per-kernel times of variants at B=1, N=64, 8k first")
    args = ap.parse_args()
    if args.plot:
        plot(*args.plot)
        return 0
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    if args.points:
        return run_points(args.points, args.out, rng, args.compile_only, args.diagnose)
    bw, flops = measure_ceilings()
    print(f"{torch.cuda.get_device_name()}  copy bw {bw / 1e12:.2f} TB/s  bf16 matmul {flops / 1e12:.0f} TFLOP/s")
    rows = []
    t0 = time.time()
    # the block-config sweep runs at the first L (8k by default); other lengths reuse the best config per (B, N)
    # and sweep only the number of splits
    decode_cache: dict = {}
    best_cfg: dict = {}
    lengths = sorted(args.L, key=lambda L: (L != 8192, L))
    for B in args.B:
        for L in lengths:
            for N in args.N:
                if args.no_sweep:
                    configs = CONFIGS[:1]
                elif (B, N) in best_cfg:
                    configs = [best_cfg[(B, N)]]
                else:
                    configs = CONFIGS
                row = run_point(B, L, N, rng, bw, flops, configs, decode_cache)
                best_cfg.setdefault((B, N), tuple(row["ours_cfg"][:4]))
                rows.append(row)
                print(json.dumps(row), flush=True)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "copy_bw": bw, "bf16_flops": flops, "seconds": time.time() - t0, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
