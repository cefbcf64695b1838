"""Benchmark: the routed MoE block (:func:`lumotree.optimized.ops.moe.moe_routed`) at Qwen3-Next-80B-A3B's and
Qwen3.5-MoE's shapes (transformers' config defaults), one GPU, bf16 random weights.

- ``qwen3-next``: hidden 2048, 512 experts of width 512, top 10 (renormalised), shared expert 512;
- ``qwen3.5-moe``: hidden 2048, 256 experts of width 512, top 8 (renormalised), shared expert 512;

at T = 1 and 16 tokens (decode, B = 1 and 16) and 64 and 16 x 64 = 1024 (tree verify of 64-node trees, B = 1 and
16). For each it times, as a CUDA-graph replay of ``--calls`` (8) back-to-back calls on distinct inputs (each call
routes to other experts, so no call finds its experts in L2; the median of ``triton.testing.do_bench`` divided by
the number of calls):

- ``ours``: ``moe_routed`` (its default launch, ``moe_config``);
- ``dense``: every expert on every token, weighted by the renormalised top-k probabilities (three einsums), where its
  ``[E, T, 2I]`` and ``[E, T, Dm]`` intermediates fit ``--max-gib``;
- ``gather``: a torch routed baseline: each (token, expert) pair's weights gathered (``w[ids]``) and multiplied in
  batched matmuls, where the gathered ``[T k, 2I + Dm, I or Dm]`` weights fit ``--max-gib``;
- ``loop``: transformers' eager expert loop (:func:`~lumotree.optimized.ops.moe.moe_routed_ref`, host syncs: timed
  eagerly, not in a graph);
- ``floor``: the bytes a step must read, the experts its tokens route to (mean over the calls' inputs) + router +
  shared expert + x and out, at the copy rate measured in the same run (a 2 GiB device-to-device copy, bytes read +
  written / time).

Every variant is checked in the same run, before timing, against ``moe_routed_ref`` on the same bf16-valued inputs
in fp32 (norm-wise relative error below 2e-2; a variant above it is marked bad and the exit status is 1).
``--sweep`` also times a few other launches of ours per case.

Run (GPU): ``python bench/moe.py [--models qwen3-next] [--tokens 1 16 64 1024] [--out bench/baselines/moe.json]``.
``--check-only``: the correctness checks on tiny shapes in fp32, no timing, no JSON (runs on a CPU under
``TRITON_INTERPRET=1``, which it sets when no GPU is present).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import torch

MODELS = {  # name: (hidden, experts, expert width, top k, shared width, norm_topk_prob)
    "qwen3-next": (2048, 512, 512, 10, 512, True),  # transformers' Qwen3NextConfig defaults (80B-A3B)
    "qwen3.5-moe": (2048, 256, 512, 8, 512, True),  # Qwen3_5MoeTextConfig defaults; its router always renormalises
}
TINY = {"tiny": (64, 16, 32, 4, 32, True)}
TOKENS = [1, 16, 64, 1024]
REL_TOL = 2e-2
SWEEP = [  # (block_m, gate_up_n, down_n, block_k, num_warps, num_stages) tried by --sweep (route_tokens: default's)
    (16, 16, 32, 128, 4, 3), (16, 32, 64, 128, 4, 3), (16, 64, 64, 128, 4, 4), (16, 128, 128, 64, 4, 3),
    (32, 64, 128, 64, 4, 3), (32, 128, 128, 64, 8, 3), (64, 128, 128, 64, 8, 3), (64, 64, 128, 64, 4, 4),
]


def copy_bandwidth(device: torch.device) -> float:
    """Bytes read + written per second of a 2 GiB device-to-device copy."""
    import triton.testing

    src = torch.empty(2**31, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=20, rep=100, return_mode="median")
    return 2 * 2**31 / (ms * 1e-3)


def graph_time_us(call, calls: int) -> float:
    """Median time of one ``call(i)`` in a CUDA graph of ``calls`` back-to-back calls (i = 0 .. calls - 1)."""
    import triton.testing

    for i in range(calls):  # compile, warm the allocator (the graph allocates from its own pool)
        call(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            call(i)
    ms = triton.testing.do_bench(graph.replay, warmup=10, rep=50, return_mode="median")
    del graph
    return ms * 1e3 / calls


def eager_time_us(call, calls: int) -> float:
    import triton.testing

    def all_calls():
        for i in range(calls):
            call(i)

    all_calls()
    return triton.testing.do_bench(all_calls, warmup=5, rep=50, return_mode="median") * 1e3 / calls


def make_block(shape: tuple, T: int, calls: int, dtype: torch.dtype, device: torch.device, seed: int) -> dict:
    """Random weights (unit-scale outputs) and ``calls`` distinct inputs ``xs: [calls, T, Dm]``."""
    Dm, E, I, _, Is, _ = shape
    gen = torch.Generator(device=device).manual_seed(seed)

    def rand(*s, scale=1.0):
        return (torch.randn(*s, generator=gen, device=device) * scale).to(dtype)

    return dict(xs=rand(calls, T, Dm), router=rand(E, Dm), w_gate_up=rand(E, 2 * I, Dm, scale=Dm**-0.5),
                w_down=rand(E, Dm, I, scale=I**-0.5), shared_gate_up=rand(2 * Is, Dm, scale=Dm**-0.5),
                shared_down=rand(Dm, Is, scale=Is**-0.5), shared_gate=rand(1, Dm, scale=Dm**-0.5))


def weights_of(block: dict) -> dict:
    return {n: t for n, t in block.items() if n != "xs"}


def dense_moe(x, router, w_gate_up, w_down, *, top_k, norm_topk_prob, shared_gate_up, shared_down, shared_gate):
    """Every expert on every token, weighted by the top-k probabilities (zero elsewhere): ``[E, T, *]`` products."""
    probs = torch.softmax((x @ router.T).float(), dim=-1)  # [T, E]
    top_p, top_i = torch.topk(probs, top_k, dim=-1)  # [T, k]
    if norm_topk_prob:
        top_p = top_p / top_p.sum(-1, keepdim=True)
    weights = torch.zeros_like(probs).scatter(1, top_i, top_p).to(x.dtype)  # [T, E]
    g, u = torch.einsum("td,efd->etf", x, w_gate_up).chunk(2, dim=-1)  # [E, T, I] each
    y = torch.einsum("eti,edi->etd", torch.nn.functional.silu(g) * u, w_down)  # [E, T, Dm]
    return torch.einsum("etd,te->td", y, weights) + shared_part(x, shared_gate_up, shared_down, shared_gate)


def gather_moe(x, router, w_gate_up, w_down, *, top_k, norm_topk_prob, shared_gate_up, shared_down, shared_gate):
    """Each (token, expert) pair's weights gathered and applied in batched matmuls (graph safe, no host sync)."""
    probs = torch.softmax((x @ router.T).float(), dim=-1)  # [T, E]
    top_p, top_i = torch.topk(probs, top_k, dim=-1)  # [T, k]
    if norm_topk_prob:
        top_p = top_p / top_p.sum(-1, keepdim=True)
    T, Dm = x.shape
    ids = top_i.reshape(-1)  # [T k]
    xs = x.repeat_interleave(top_k, dim=0)[:, None, :]  # [T k, 1, Dm]
    g, u = torch.bmm(xs, w_gate_up[ids].transpose(1, 2)).chunk(2, dim=-1)  # [T k, 1, I] each
    y = torch.bmm(torch.nn.functional.silu(g) * u, w_down[ids].transpose(1, 2))  # [T k, 1, Dm]
    y = (y.view(T, top_k, Dm) * top_p.to(x.dtype)[..., None]).sum(1)  # [T, Dm]
    return y + shared_part(x, shared_gate_up, shared_down, shared_gate)


def shared_part(x, shared_gate_up, shared_down, shared_gate):
    g, u = (x @ shared_gate_up.T).chunk(2, dim=-1)  # [T, Is] each
    return torch.sigmoid(x @ shared_gate.T) * ((torch.nn.functional.silu(g) * u) @ shared_down.T)  # [T, Dm]


def fits(shape: tuple, T: int, variant: str, max_gib: float) -> bool:
    """Whether a torch variant's intermediates fit ``max_gib`` (bf16)."""
    Dm, E, I, k, _, _ = shape
    if variant == "dense":
        need = E * T * (2 * I + I + Dm) * 2
    else:  # gather: the gathered gate | up and down weights of every pair
        need = T * k * (2 * I * Dm + Dm * I) * 2
    return need <= max_gib * 2**30


def floor_bytes(shape: tuple, T: int, block: dict) -> float:
    """Mean over the inputs of the bytes one call must read and write: the routed experts, router, shared expert,
    x and out."""
    from lumotree.optimized.ops.moe import route_ref

    Dm, E, I, k, Is, norm = shape
    expert = 3 * I * Dm * 2
    touched = [int(torch.unique(route_ref(x, block["router"], k, norm)[0]).numel()) for x in block["xs"]]
    fixed = E * Dm * 2 + (3 * Is * Dm + Dm) * 2 + 2 * T * Dm * 2
    return fixed + expert * sum(touched) / len(touched)


def check(fn, block: dict, shape: tuple, ref: torch.Tensor) -> float:
    _, _, _, k, _, norm = shape
    y = fn(block["xs"][0], **weights_of(block), top_k=k, norm_topk_prob=norm)
    return float((y.float() - ref).norm() / ref.norm())


def run_case(model: str, shape: tuple, T: int, args, copy_bw: float | None, device: torch.device) -> dict:
    from lumotree.optimized.ops.moe import MoEConfig, moe_config, moe_routed, moe_routed_ref

    Dm, E, I, k, Is, norm = shape
    dtype = torch.float32 if args.check_only else torch.bfloat16
    block = make_block(shape, T, args.calls, dtype, device, seed=T)
    wts = weights_of(block)
    ref = moe_routed_ref(block["xs"][0].float(), **{n: t.float() for n, t in wts.items()}, top_k=k,
                         norm_topk_prob=norm)  # [T, Dm] fp32
    default = moe_config(T, k, E, I, Dm, device)
    row = dict(model=model, T=T, hidden=Dm, experts=E, width=I, top_k=k, shared=Is, config=list(default))
    outs = torch.empty((args.calls, T, Dm), dtype=dtype, device=device)  # [calls, T, Dm]

    def ours(cfg):
        return lambda i: moe_routed(block["xs"][i], **wts, top_k=k, norm_topk_prob=norm, config=cfg,
                                    validate=False, out=outs[i])

    def torch_call(fn):
        return lambda i: fn(block["xs"][i], **wts, top_k=k, norm_topk_prob=norm)

    variants = {"ours": (ours(None), True, lambda x, **kw: moe_routed(x, **kw, validate=False))}
    for name, fn in (("dense", dense_moe), ("gather", gather_moe)):  # name: (call, in a graph, checked function)
        if fits(shape, T, name, args.max_gib):
            variants[name] = (torch_call(fn), True, fn)
        else:
            row[name] = dict(skipped=f"intermediates above --max-gib {args.max_gib}")
    variants["loop"] = (torch_call(moe_routed_ref), False, None)  # the reference itself, in bf16
    bad = 0
    for name, (call, in_graph, fn) in variants.items():
        entry = {}
        if fn is not None:
            entry["rel_err"] = check(fn, block, shape, ref)
            entry["ok"] = entry["rel_err"] < REL_TOL
            bad += not entry["ok"]
        if not args.check_only:
            entry["us"] = graph_time_us(call, args.calls) if in_graph else eager_time_us(call, args.calls)
        row[name] = entry
    if args.sweep and not args.check_only:
        row["sweep"] = []
        for cfg in SWEEP:
            c = MoEConfig(*cfg[:4], default.route_tokens, *cfg[4:])
            try:
                err = check(lambda x, c=c, **kw: moe_routed(x, **kw, config=c, validate=False), block, shape, ref)
                row["sweep"].append(dict(config=list(c), rel_err=err, ok=err < REL_TOL,
                                         us=graph_time_us(ours(c), args.calls)))
            except Exception as exc:  # a launch that fails to compile is a result too
                row["sweep"].append(dict(config=list(c), error=repr(exc)[:300]))
    row["floor"] = dict(bytes=floor_bytes(shape, T, block))
    if copy_bw is not None:
        row["floor"]["us"] = row["floor"]["bytes"] / copy_bw * 1e6
        row["ours"]["of_floor"] = row["floor"]["us"] / row["ours"]["us"]
    row["bad"] = bad
    return row


def table(rows: list[dict]) -> str:
    head = "| model | T | ours us | floor us | % of floor | dense us | gather us | loop us | rel err ours |"
    lines = [head, "|" + "---|" * 9]

    def us(entry: dict) -> str:
        return f"{entry['us']:.1f}" if "us" in entry else "-"

    for r in rows:
        floor = r.get("floor", {})
        pct = f"{100 * r['ours']['of_floor']:.0f}" if "of_floor" in r["ours"] else "-"
        lines.append(f"| {r['model']} | {r['T']} | {us(r['ours'])} | {us(floor)} | {pct} | {us(r['dense'])} | "
                     f"{us(r['gather'])} | {us(r['loop'])} | {r['ours']['rel_err']:.1e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--tokens", nargs="+", type=int, default=TOKENS, help=f"values of T (default {TOKENS})")
    ap.add_argument("--calls", type=int, default=8, help="calls per CUDA graph, each on its own input (default 8)")
    ap.add_argument("--max-gib", type=float, default=16.0, help="largest intermediates of the torch variants")
    ap.add_argument("--sweep", action="store_true", help="also time the launches of SWEEP")
    ap.add_argument("--check-only", action="store_true", help="tiny fp32 shapes, correctness only (CPU: interpreter)")
    ap.add_argument("--out", default="bench/baselines/moe.json", help="the JSON written after a timed run")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    if args.check_only and not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
    elif not cuda:
        raise SystemExit("bench/moe.py needs a CUDA GPU (or --check-only)")
    import triton

    device = torch.device("cuda" if cuda else "cpu")
    models = TINY if args.check_only else {m: MODELS[m] for m in args.models}
    tokens = [1, 3, 17] if args.check_only else args.tokens
    args.calls = 2 if args.check_only else args.calls
    copy_bw = None if args.check_only else copy_bandwidth(device)
    if copy_bw is not None:
        print(f"{torch.cuda.get_device_name(device)}: copy {copy_bw / 1e12:.2f} TB/s (read + written), torch "
              f"{torch.__version__}, triton {triton.__version__}", flush=True)
    start, rows = time.perf_counter(), []
    for model, shape in models.items():
        for T in tokens:
            row = run_case(model, shape, T, args, copy_bw, device)
            rows.append(row)
            parts = [f"{n}" + (f" {row[n]['us']:.1f} us" if "us" in row[n] else "")
                     + (f" (err {row[n]['rel_err']:.1e})" if "rel_err" in row[n] else "")
                     for n in ("ours", "dense", "gather", "loop", "floor") if "skipped" not in row.get(n, {})]
            print(f"{model} T={T}: " + ", ".join(parts) + f"; floor bytes {row['floor']['bytes'] / 1e6:.2f} MB",
                  flush=True)
    bad = sum(r["bad"] for r in rows)
    print(f"{bad} results above rel err {REL_TOL}; {time.perf_counter() - start:.0f} s")
    print(table(rows))
    if not args.check_only:
        result = dict(card=torch.cuda.get_device_name(device), date=datetime.date.today().isoformat(),
                      torch=torch.__version__, triton=triton.__version__, dtype="bf16", copy_TBps=copy_bw / 1e12,
                      calls_per_graph=args.calls, command="python bench/moe.py " + " ".join(sys.argv[1:]),
                      rows=rows, table=table(rows))
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
