"""Benchmark: one Gated DeltaNet layer's tree step through the public API, at Qwen3-Next shapes (H = 16, HV = 32,
K = V = 128), one GPU, against flash-linear-attention and the baselines engines use today.

For every (B requests, N nodes, tree kind) it times, with CUDA-graph replay and the median of
``triton.testing.do_bench``, side by side in one run:

- ``deferred``: one step in steady state (tensor-core precision, ``tf32``) of
  :func:`lumotree.optimized.ops.gdn_tree.gdn_tree_verify` with
  ``pending`` (the previous step's recorded commit applied while the state is streamed) plus
  :func:`~lumotree.optimized.ops.gdn_tree.gdn_tree_commit` with ``pending`` (the accepted path recorded); the
  dispatch takes the fused sm_90 kernel where :func:`~lumotree.optimized.ops.gdn_tree.fused_preferred` (``path``
  says which ran); ``deferred_verify``: the verify alone;
- ``inplace_<mode>``: ``gdn_tree_verify`` + ``gdn_tree_commit`` without ``pending`` (the portable pipeline, the state
  rebuilt in place) in the modes ``tf32`` and ``ieee``;
- ``ar``: fla's single-token decode step (``fused_recurrent_gated_delta_rule``, T = 1): the yardstick of the ratios;
- ``branch``: the tree branch by branch (every root-to-leaf path re-run from S0 with fla's fused_recurrent);
- ``pernode``: one state per node, level by level (torch);
- ``floor``: S0 read and one state written at the copy rate measured in the same run.

q, k, v fp32 (``--dtype bf16``: bf16), gates and states fp32, q / k L2-normalised in the kernels; the accepted node
of each request at about half its tree's depth. Checked in the same run before timing, on the first requests: every
method's outputs (and ours' committed states) against a float64 torch closed form.

Run (GPU): ``python bench/gdn_tree.py [--shapes 64x64 1x64 ...] [--out bench/baselines/gdn_tree.json]``; fla-core
0.6 for the peers (left out, and said so, when it is missing).
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
import torch
import triton

from lumotree.optimized.ops.gdn_tree import (fused_preferred, gdn_tree_commit, gdn_tree_flush, gdn_tree_verify,
                                             pending_commits)
from lumotree.optimized.ops.gdn_tree import reference as R
from lumotree.optimized.ops.tree_meta import tree_metadata
from lumotree.reference.tree import random_parents

H, HV, K, V = 16, 32, 128, 128
DEVICE = "cuda"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
SHAPES = [(64, 64), (32, 64), (16, 64), (8, 64), (1, 64), (64, 32), (1, 32), (64, 128), (1, 128)]
MODES = ("tf32", "ieee")


# ------------------------------------------------------------------------------------------------------- workloads
def eagle_tree(n: int, rng: np.random.Generator, topk: int = 4, width: int = 8) -> list[int]:
    """EAGLE-2-like: each frontier node proposes ``topk`` children with Dirichlet probabilities; each level keeps the
    ``width`` children of highest cumulative path probability; stops at n nodes."""
    parents, logp, frontier = [-1], [0.0], [0]
    while len(parents) < n:
        cand = []
        for node in frontier:
            cand += [(logp[node] + math.log(p + 1e-12), node) for p in rng.dirichlet(np.full(topk, 0.5))]
        cand.sort(reverse=True)
        frontier = []
        for lp, node in cand[: min(width, n - len(parents))]:
            parents.append(node)
            logp.append(lp)
            frontier.append(len(parents) - 1)
    return parents


def make_tree(kind: str, n: int, rng: np.random.Generator) -> list[int]:
    if kind == "chain":
        return [-1] + list(range(n - 1))
    if kind == "eagle":
        return eagle_tree(n, rng)
    return random_parents(n, rng)


def depths(parents: list[int]) -> list[int]:
    d: list[int] = []
    for p in parents:
        d.append(0 if p < 0 else d[p] + 1)
    return d


def make_inputs(B: int, N: int, kind: str, seed: int, dtype=torch.float32) -> dict:
    rng = np.random.default_rng(seed)
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    rows = [make_tree(kind, N, rng) for _ in range(B)]
    q = torch.randn(B, N, H, K, device=DEVICE, generator=gen).to(dtype)  # [B, N, H, K]
    k = torch.randn(B, N, H, K, device=DEVICE, generator=gen).to(dtype)  # [B, N, H, K]
    v = torch.randn(B, N, HV, V, device=DEVICE, generator=gen).to(dtype)  # [B, N, HV, V]
    A_log = torch.log(torch.empty(HV, device=DEVICE).uniform_(1, 16, generator=gen))  # [HV]
    dt_bias = torch.randn(HV, device=DEVICE, generator=gen) * 0.5  # [HV]
    a, b = (torch.randn(B, N, HV, device=DEVICE, generator=gen) for _ in range(2))  # [B, N, HV]
    g, beta = R.gdn_gates_ref(a, b, A_log, dt_bias)  # [B, N, HV] each
    dep = [depths(r) for r in rows]
    accepted = [int(np.argmin([abs(x - max(d) // 2) for x in d])) if kind != "chain" else N - 1 for d in dep]
    return dict(rows=rows, parents=torch.tensor(rows, dtype=torch.int32, device=DEVICE), q=q, k=k, v=v, g=g,
                beta=beta, pool=torch.randn(B, HV, K, V, device=DEVICE, generator=gen) * 0.1,  # [P = B, HV, K, V]
                slots=torch.randperm(B, device=DEVICE, generator=gen).to(torch.int32),
                accepted=torch.tensor(accepted, dtype=torch.int32, device=DEVICE),
                max_depth=max(max(d) for d in dep))


# ------------------------------------------------------------------------------------------------------------ timing
def graph_time(fn, rep_ms: int = 100) -> float:
    """Median microseconds of CUDA-graph replays of ``fn`` (captured after a warm-up on a side stream)."""
    fn()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return 1e3 * triton.testing.do_bench(graph.replay, warmup=10, rep=rep_ms, return_mode="median")


def peak_mib(fn) -> float:
    """Peak device memory allocated while ``fn`` runs, above what was allocated before (MiB)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def copy_bandwidth() -> float:
    """Bytes read + written per second of a 4 GiB device-to-device copy."""
    src = torch.randn(2**30, device=DEVICE)
    dst = torch.empty_like(src)
    us = 1e3 * triton.testing.do_bench(lambda: dst.copy_(src), warmup=10, rep=200, return_mode="median")
    return 2 * 4 * 2**30 / (us * 1e-6)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """``|got - want| / |want|`` (Frobenius norms, float64)."""
    return float((got.double() - want.double()).norm() / want.double().norm())


# ------------------------------------------------------------------------------------------------------------ ours
def common(x: dict) -> dict:
    return dict(parents=x["parents"], state_indices=x["slots"], meta=tree_metadata(x["parents"]), validate=False)


def inplace_fns(x: dict, mode: str) -> tuple:
    """``(step, verify, pool)``: verify + in-place commit on a pool of its own (each replay commits again: a step
    in steady state)."""
    pool, kw = x["pool"].clone(), common(x)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])

    def verify():
        return gdn_tree_verify(*args, initial_state=pool, use_qk_l2norm_in_kernel=True, input_precision=mode, **kw)

    def step():
        gdn_tree_commit(verify()[1], x["accepted"], initial_state=pool, input_precision=mode, **kw)

    return step, verify, pool


def deferred_fns(x: dict) -> tuple:
    """``(step, verify, pool, pending, state)``: the deferred step on a pool of its own with one commit recorded
    (``state["first"]``: the recorded step's factors; ``o`` / ``factors``: the last verify's)."""
    pool, kw = x["pool"].clone(), common(x)
    pending = pending_commits(pool, H)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    _, first = gdn_tree_verify(*args, initial_state=pool, use_qk_l2norm_in_kernel=True, pending=pending,
                               input_precision="tf32", **kw)
    gdn_tree_commit(first, x["accepted"], initial_state=pool, pending=pending, **kw)
    state = {"first": first}

    def verify():
        state["o"], state["factors"] = gdn_tree_verify(*args, initial_state=pool, use_qk_l2norm_in_kernel=True,
                                                       pending=pending, max_depth=x["max_depth"],
                                                       input_precision="tf32", **kw)

    def step():
        verify()
        gdn_tree_commit(state["factors"], x["accepted"], initial_state=pool, pending=pending, **kw)

    return step, verify, pool, pending, state


def closed_form64(x: dict, pool64: torch.Tensor, sub: int):
    """Float64 outputs and factors of the first ``sub`` requests from the states ``pool64`` (indexed by slot)."""
    args = [x[n][:sub].double() for n in ("q", "k", "v", "g", "beta")]
    return R.gdn_tree_closed_form_ref(*args, pool64, x["slots"][:sub], x["parents"][:sub], use_qk_l2norm_in_kernel=True)


def inplace_errors(x: dict, mode: str, sub: int) -> tuple[float, float]:
    """Output and committed-state errors of one in-place step against float64."""
    _, verify, pool = inplace_fns(x, mode)
    pool64 = pool.double()
    o, factors = verify()
    gdn_tree_commit(factors, x["accepted"], initial_state=pool, input_precision=mode, **common(x))
    ro, rf = closed_form64(x, pool64, sub)
    rs = R.gdn_tree_commit_ref(pool64, x["slots"][:sub], rf, x["parents"][:sub], x["accepted"][:sub])
    return rel_err(o[:sub], ro), rel_err(pool[x["slots"][:sub].long()], rs)


def deferred_errors(x: dict, sub: int) -> tuple[float, float, float]:
    """One deferred verify after a recorded commit, against float64: outputs, Delta, and the state it wrote (the
    float64 commit of the recorded factors)."""
    _, verify, pool, _, state = deferred_fns(x)
    s1 = R.gdn_tree_commit_ref(x["pool"].double(), x["slots"], state["first"], x["parents"], x["accepted"])
    verify()
    slots = x["slots"].long()
    pool64 = torch.zeros(pool.shape, dtype=torch.float64, device=DEVICE)
    pool64[slots] = s1
    ro, rf = closed_form64(x, pool64, sub)
    return (rel_err(state["o"][:sub], ro), rel_err(state["factors"].delta[:sub], rf.delta),
            rel_err(pool[slots], s1))  # the verify wrote the recorded commit's state back


# ------------------------------------------------------------------------------------------------------------ peers
def fla_fns(x: dict, fla) -> tuple:
    """fla's decode step and branch-by-branch verify of ``x``'s trees (every path padded at its end with g = beta = 0,
    which leaves the state unchanged) and the paths."""
    B, N = x["parents"].shape
    S0 = x["pool"][x["slots"].long()].contiguous()  # [B, HV, K, V]
    one = {n: x[n][:, :1].contiguous() for n in ("q", "k", "v", "g", "beta")}

    def ar():
        return fla.fused_recurrent_gated_delta_rule(one["q"], one["k"], one["v"], g=one["g"], beta=one["beta"],
                                                    initial_state=S0, output_final_state=True,
                                                    use_qk_l2norm_in_kernel=True)

    paths, owner = [], []
    for b, row in enumerate(x["rows"]):
        kids = set(row[1:])
        for leaf in (i for i in range(N) if i not in kids):
            path, node = [], leaf
            while node >= 0:
                path.append(node)
                node = row[node]
            paths.append(path[::-1])
            owner.append(b)
    T = max(len(p) for p in paths)
    node = torch.tensor([p + [p[-1]] * (T - len(p)) for p in paths], device=DEVICE)  # [L, T]
    live = torch.tensor([[t < len(p) for t in range(T)] for p in paths], device=DEVICE)  # [L, T]
    owner_t = torch.tensor(owner, device=DEVICE)  # [L]
    req = owner_t[:, None].expand(-1, T)  # [L, T]

    def branch():
        qb, kb, vb = (x[n][req, node] for n in ("q", "k", "v"))  # [L, T, H or HV, K or V]
        return fla.fused_recurrent_gated_delta_rule(qb, kb, vb, g=x["g"][req, node] * live[..., None],
                                                    beta=x["beta"][req, node] * live[..., None],
                                                    initial_state=S0[owner_t], output_final_state=True,
                                                    use_qk_l2norm_in_kernel=True)

    return ar, branch, (paths, owner)


def fla_errors(x: dict, ar, branch, paths, sub: int = 2) -> tuple[float, float]:
    """The decode step's outputs against the roots', branch by branch's every path step against its node's."""
    ro, _ = closed_form64(x, x["pool"].double(), sub)
    o_ar = ar()[0]
    o_br = branch()[0]
    got, want = [], []
    for p, (path, b) in enumerate(zip(*paths)):
        if b < sub:
            got.append(o_br[p, : len(path)])
            want.append(ro[b, path])
    return rel_err(o_ar[:sub, 0], ro[:, 0]), rel_err(torch.cat(got), torch.cat(want))


def pernode_fn(x: dict):
    levels = [tuple(t.to(DEVICE) for t in lv) for lv in R.tree_levels(x["parents"])]
    return lambda: R.gdn_tree_pernode_ref(x["q"], x["k"], x["v"], x["g"], x["beta"], x["pool"], x["slots"],
                                         x["parents"], use_qk_l2norm_in_kernel=True, levels=levels, return_states=False)


# -------------------------------------------------------------------------------------------------------------- main
def run_row(B: int, N: int, kind: str, dtype, bandwidth: float, fla, sub: int) -> dict:
    x = make_inputs(B, N, kind, seed=B * 1000 + N, dtype=dtype)
    row = dict(B=B, N=N, kind=kind, max_depth=x["max_depth"])
    row["floor_us"] = 2 * B * HV * K * V * 4 / bandwidth * 1e6
    row["path"] = "fused" if fused_preferred(x["q"], x["k"], x["v"], x["pool"], None) else "portable + flush"
    row["err_o_deferred"], row["err_delta_deferred"], row["err_s_deferred"] = deferred_errors(x, min(B, sub))
    step, verify, pool, pending, _ = deferred_fns(x)
    row["deferred_us"] = graph_time(step)
    row["deferred_verify_us"] = graph_time(verify)
    gdn_tree_flush(pending, pool)
    for mode in MODES:
        row[f"err_o_{mode}"], row[f"err_s_{mode}"] = inplace_errors(x, mode, min(B, sub))
        step_m, verify_m, _ = inplace_fns(x, mode)
        row[f"inplace_{mode}_us"] = graph_time(step_m)
        if mode == "tf32":
            row["inplace_verify_tf32_us"] = graph_time(verify_m)
            row["inplace_MiB"] = peak_mib(step_m)
    if fla is not None:
        ar, branch, paths = fla_fns(x, fla)
        row["ar_err_o"], row["branch_err_o"] = fla_errors(x, ar, branch, paths)
        row["ar_us"] = graph_time(ar)
        if B * N <= 64 * 64:
            row["branch_us"] = graph_time(branch, rep_ms=60)
    if B * N <= 64 * 64 and kind != "chain":
        pernode = pernode_fn(x)
        row["pernode_us"] = graph_time(pernode, rep_ms=60)
        row["pernode_MiB"] = peak_mib(pernode)
    return row


def table(rows: list[dict]) -> list[str]:
    """The markdown table of the docs page (ratios to fla's decode step)."""
    out = ["| B | N | tree | depth | deferred step (path) | / ar | in-place tf32 | / ar | in-place ieee | ar | "
           "branch / deferred | per-node / deferred | floor | err o / Delta / state (deferred) | err tf32 / ieee |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['B']} | {r['N']} | {r['kind']} | - | error: {r['error'][:60]} |" + " |" * 10)
            continue
        get = lambda key: r.get(key, math.nan)  # noqa: E731 - a peer left out of the run
        d, t, ar = r["deferred_us"], r["inplace_tf32_us"], get("ar_us")
        out.append(f"| {r['B']} | {r['N']} | {r['kind']} | {r['max_depth']} | {d:.1f} µs ({r['path']}) | "
                   f"{d / ar:.2f}x | {t:.1f} | {t / ar:.2f}x | {r['inplace_ieee_us']:.1f} | {ar:.1f} | "
                   f"{get('branch_us') / d:.1f}x | {get('pernode_us') / d:.1f}x | {r['floor_us']:.1f} | "
                   f"{r['err_o_deferred']:.1e} / {r['err_delta_deferred']:.1e} / {r['err_s_deferred']:.1e} | "
                   f"{max(r['err_o_tf32'], r['err_s_tf32']):.1e} / {max(r['err_o_ieee'], r['err_s_ieee']):.1e} |")
    return out


def batch_and_nodes(text: str) -> tuple[int, int]:
    """``"64x128"`` -> ``(64, 128)`` (``--shapes``)."""
    try:
        B, N = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape {text!r}: want BxN, e.g. 64x128") from None
    if B < 1 or not 1 <= N <= 128:
        raise argparse.ArgumentTypeError(f"shape {text!r}: B >= 1 and 1 <= N <= 128")
    return B, N


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", type=batch_and_nodes, default=SHAPES, metavar="BxN")
    parser.add_argument("--kinds", nargs="+", default=["random"], choices=["random", "eagle", "chain"])
    parser.add_argument("--dtype", default="fp32", choices=list(DTYPES), help="q, k, v dtype (gates, states fp32)")
    parser.add_argument("--err-sub", type=int, default=4, help="requests checked against float64 per row")
    parser.add_argument("--budget-s", type=float, default=1e9, help="no new row after this many seconds")
    parser.add_argument("--out", default="bench/baselines/gdn_tree.json")
    args = parser.parse_args()
    start = time.time()
    try:
        import fla.ops.gated_delta_rule as fla  # noqa: PLC0415
    except ImportError as exc:
        print(f"fla not importable ({exc}): no peer columns", flush=True)
        fla = None
    bandwidth = copy_bandwidth()
    result = dict(card=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d"), torch=torch.__version__,
                  triton=triton.__version__, dtype=args.dtype, copy_TBps=bandwidth / 1e12,
                  command="python bench/gdn_tree.py --shapes " + " ".join(f"{B}x{N}" for B, N in args.shapes), rows=[])
    for B, N in args.shapes:
        for kind in args.kinds:
            if time.time() - start > args.budget_s:
                result.setdefault("skipped", []).append(f"{B}x{N} {kind}")
                continue
            try:
                row = run_row(B, N, kind, DTYPES[args.dtype], bandwidth, fla, args.err_sub)
            except Exception as exc:  # noqa: BLE001 - keep the rest of the run, report the failure
                row = dict(B=B, N=N, kind=kind, error=f"{type(exc).__name__}: {str(exc)[:300]}")
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
            torch.cuda.empty_cache()
    result["table"] = table(result["rows"])
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    print(f"{result['card']}, copy {bandwidth / 1e12:.2f} TB/s, {args.dtype} inputs")
    print("\n".join(result["table"]))
    bad = [r for r in result["rows"] if "error" in r or r["err_o_deferred"] > 3e-3 or r["err_s_deferred"] > 5e-4
           or max(r["err_o_tf32"], r["err_s_tf32"]) > 3e-3 or max(r["err_o_ieee"], r["err_s_ieee"]) > 1e-5]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
