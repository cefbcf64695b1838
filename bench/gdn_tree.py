"""Benchmark: one Gated DeltaNet layer verifying draft trees at Qwen3-Next shapes (H=16, HV=32, K=V=128), one GPU.

For every (B requests, N nodes, tree kind) it times, with CUDA-graph replay and the median of
``triton.testing.do_bench``, side by side in one run:

- ``ours_<mode>``: :func:`lumotree.optimized.gdn_tree.gdn_tree_verify` (q/k L2 norm in the kernel, gates given)
  plus :func:`~lumotree.optimized.gdn_tree.gdn_tree_commit` of an accepted node of depth ~max/2, for the modes
  ``ieee``, ``tf32x3``, ``tf32``; ``verify_*`` and ``commit_*`` alone. Verify + commit launches the commit with
  PDL behind the verify, which signals at its start (``gdn_tree_commit(pdl=True)``,
  ``gdn_tree_verify(launch_dependents=True)``), and the split pipeline's apply with PDL behind its solve
  (``KernelConfig.apply_pdl``); ``nopdl_*``: verify + commit with every launch plain, and ``nopdl_diff_*`` its
  largest relative difference from the default's outputs, deltas and committed states (0 expected: the same
  kernels); ``meta_us``: the per-step tree metadata
  (shared by all layers of a step, not per layer);
- ``split_<mode>`` / ``fused_<mode>``: in small batches, verify + commit with the other verify form, and its errors
  (``split_err_*`` / ``fused_err_*``): the split pipeline of large batches where the default is the fused kernel,
  the fused kernel where the default is the small-batch split pipeline (N >= 64);
- ``ar``: flash-linear-attention's single-token decode step (``fused_recurrent_gated_delta_rule``, T=1);
- ``branch``: the tree branch by branch: every root-to-leaf path re-run from S0 with fla's fused_recurrent (paths
  batched, padded at the end with g = beta = 0);
- ``pernode``: one state per node, level by level (:func:`lumotree.optimized.gdn_tree_ref.gdn_tree_pernode_ref`);
- ``chunk``: fla's chunk kernel on chains (``chunk_gated_delta_rule`` with the final state = commit of the leaf);
- ``floor``: read S0 + write one state at the copy bandwidth measured in the same run; ``io_floor``: every byte
  verify + commit must move (S0 twice, S once, q/k/v in, o/delta out) at that bandwidth.

Errors against a float64 torch closed form (tested against the exact reference in tests/) on the first requests:
``err_o_<mode>`` (outputs), ``err_s_<mode>`` (committed state). Peak transient memory per method (``*_MiB``;
``o_MiB``: the output's size, which every method allocates; the table gives our share of the per-node peak with
and without it).

The fla baselines run first, in child processes (``--fla-budget-s``, ``--fla-shapes``), each checked against the
float64 closed form (``<method>_err_o``). Until 2026-12-02 ``beta`` went into fla 0.6.0's ``gk`` parameter, and its
fused_recurrent faulted (illegal memory access) or gave wrong outputs; a fault ends only the child, the job it died
in is recorded as failed and a new child takes the rest.

``--dtype bf16``: q, k, v in bf16 (the model's activations) for ours and every fla baseline, gates and the state
pool in fp32 as before; the float64 references then take the same bf16 values, and ``err_o_torch16`` is the output
error of a torch implementation of the same math in bf16 (per-node states, pool and gates cast to bf16) against
them: the bf16 target is our error within 2x of it.

Run: ``python bench/gdn_tree.py --out results.json`` (``--quick`` for a small subset, ``--shapes 64x128 1x128`` for
chosen (B, N), ``--sweep`` to time the launch configurations at the main shapes first). Needs a CUDA GPU and
fla-core 0.6.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
import triton

from lumotree.reference.tree import random_parents
from lumotree.optimized import gdn_tree as G
from lumotree.optimized import gdn_tree_ref as R

H, HV, K, V = 16, 32, 128, 128
DEVICE = "cuda"
MODES = ("tf32", "tf32x3", "ieee")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
PRIORITY = [(64, 64), (1, 64), (16, 64), (64, 32), (64, 128), (1, 8), (1, 32), (1, 128), (16, 8), (16, 32),
            (16, 128), (64, 8)]
SWEEP = [G.KernelConfig(bv, bk, nw, 2, split) for bv, bk, nw, split in
         [(32, 32, 4, True), (64, 32, 4, True), (64, 32, 8, True), (128, 32, 8, True), (32, 64, 4, True),
          (16, 32, 4, False), (32, 32, 4, False), (64, 32, 8, False)]]
COMMIT_SWEEP = [G.KernelConfig(bv, 128, nw, 1) for bv, nw in [(32, 4), (64, 4), (64, 8), (128, 8)]]
FLA_METHODS = ("ar", "branch", "chunk")


# ------------------------------------------------------------------------------------------------------------ trees


def eagle_tree(n: int, rng: np.random.Generator, topk: int = 4, width: int = 8) -> list[int]:
    """EAGLE-2-like: each frontier node proposes ``topk`` children with Dirichlet probabilities; each level keeps the
    ``width`` children of highest cumulative path probability; stops at n nodes."""
    parents, logp = [-1], [0.0]
    frontier = [0]
    while len(parents) < n:
        cand = []
        for node in frontier:
            probs = rng.dirichlet(np.full(topk, 0.5))
            cand += [(logp[node] + math.log(p + 1e-12), node) for p in probs]
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
    if kind == "star":
        return [-1] + [0] * (n - 1)
    if kind == "eagle":
        return eagle_tree(n, rng)
    return random_parents(n, rng)


def depths(parents: list[int]) -> list[int]:
    d = []
    for p in parents:
        d.append(0 if p < 0 else d[p] + 1)
    return d


# ------------------------------------------------------------------------------------------------------------ timing
def graph_time(fn, rep_ms: int = 100) -> tuple[float, bool]:
    """Median microseconds of CUDA-graph replays of ``fn`` (eager when capture fails): (us, graph_ok)."""
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
        torch.cuda.synchronize()
        return 1e3 * triton.testing.do_bench(graph.replay, warmup=10, rep=rep_ms, return_mode="median"), True
    except Exception:  # noqa: BLE001 - capture unsupported by this method: time it eagerly
        torch.cuda.synchronize()
        return 1e3 * triton.testing.do_bench(fn, warmup=10, rep=rep_ms, return_mode="median"), False


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
    del src, dst
    return 2 * 4 * 2**30 / (us * 1e-6)


def matmul_tf32_rate() -> float:
    """tf32 matrix rate (FLOP/s) of an 8192^3 fp32 product with tf32 allowed, random data."""
    a = torch.randn(8192, 8192, device=DEVICE)
    b = torch.randn(8192, 8192, device=DEVICE)
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    us = 1e3 * triton.testing.do_bench(lambda: a @ b, warmup=10, rep=200, return_mode="median")
    torch.backends.cuda.matmul.allow_tf32 = old
    return 2 * 8192**3 / (us * 1e-6)


# --------------------------------------------------------------------------------------------------------- workloads
def make_inputs(B: int, N: int, kind: str, seed: int, dtype=torch.float32):
    rng = np.random.default_rng(seed)
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    rows = [make_tree(kind, N, rng) for _ in range(B)]
    parents = torch.tensor(rows, dtype=torch.int32, device=DEVICE)  # [B, N]
    q = torch.randn(B, N, H, K, device=DEVICE, generator=gen).to(dtype)
    k = torch.randn(B, N, H, K, device=DEVICE, generator=gen).to(dtype)
    v = torch.randn(B, N, HV, V, device=DEVICE, generator=gen).to(dtype)
    a = torch.randn(B, N, HV, device=DEVICE, generator=gen)
    A_log = torch.log(torch.empty(HV, device=DEVICE).uniform_(1, 16, generator=gen))
    dt_bias = torch.randn(HV, device=DEVICE, generator=gen) * 0.5
    g, beta = R.gdn_gates_ref(a, torch.randn(B, N, HV, device=DEVICE, generator=gen), A_log, dt_bias)
    pool = torch.randn(B, HV, K, V, device=DEVICE, generator=gen) * 0.1  # [P = B, HV, K, V]
    slots = torch.randperm(B, device=DEVICE, generator=gen).to(torch.int32)
    dep = [depths(r) for r in rows]
    accepted = torch.tensor([int(np.argmin([abs(x - max(d) // 2) for x in d])) if kind != "chain" else N - 1
                             for d in dep], dtype=torch.int32, device=DEVICE)
    return dict(rows=rows, parents=parents, q=q, k=k, v=v, g=g, beta=beta, pool=pool, slots=slots,
                accepted=accepted, max_depth=max(max(d) for d in dep), leaves=len(set(range(N)) - set(rows[0])))


def row_config(x, mode: str, mod=G, batch: int | None = None):
    """``verify_config`` of the row's shape, inputs and device (for ``batch`` requests instead of the row's B).
    ``mod``: the gdn_tree module (a probe's variant)."""
    B, N, HV_ = x["v"].shape[:3]
    return mod.verify_config(batch or B, HV_, N, K, V, x["q"].device, H, mode, x["q"].dtype)


def nopdl_config(x, mode: str, config=None):
    """The row's launch config with the split pipeline's apply launched without PDL (the verify of ``nopdl``)."""
    return (config or row_config(x, mode))._replace(apply_pdl=False)


def ours_fns(x, mode: str, config=None):
    meta = G.tree_meta(x["parents"])
    pool_work = x["pool"].clone()

    def verify(**kw):
        kw = {"config": config, **kw}
        return G.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], pool_work, x["slots"], x["parents"],
                                 use_qk_l2norm_in_kernel=True, input_precision=mode, meta=meta, validate=False, **kw)

    _, factors = verify()

    def commit():
        G.gdn_tree_commit(pool_work, x["slots"], factors, x["parents"], x["accepted"], input_precision=mode,
                          meta=meta, validate=False)

    commit.state = (pool_work, factors, meta)

    def both(pdl=True, **kw):
        """Verify, then the commit as a PDL launch behind it (``pdl``)."""
        _, f = verify(launch_dependents=pdl, **kw)
        G.gdn_tree_commit(pool_work, x["slots"], f, x["parents"], x["accepted"], input_precision=mode, meta=meta,
                          validate=False, pdl=pdl)

    without_pdl = nopdl_config(x, mode, config)

    def nopdl():
        """``both`` with every launch plain (the apply too)."""
        both(pdl=False, config=without_pdl)

    return verify, commit, both, nopdl, pool_work


def other_config(x, mode: str):
    """``(name, config)`` of the other verify form beside a small batch's default: the split pipeline of large
    batches (``split``) where the default is the fused kernel, the fused kernel where it is the small-batch split
    pipeline: at N = 64 32 V columns, 4 warps, 3 stages (its default before the fourteenth session), past N = 64
    64 columns, 8 warps, 2 stages, tiles through descriptors (before the twenty-sixth); None for large batches."""
    large = -(-2 * G._num_sms(x["q"].device) // x["v"].shape[2])  # the smallest batch of the large-batch split
    if not row_config(x, mode).split:
        return "split", row_config(x, mode, batch=large)
    if x["v"].shape[0] < large:
        wide = x["v"].shape[1] > 64
        return "fused", G.KernelConfig(64, 32, 8, 2, False, tma=mode != "ieee") if wide else G.KernelConfig(
            32, 32, 4, 3, False)
    return None


def nopdl_difference(x, mode: str) -> float:
    """Largest relative difference of outputs, deltas and committed states between the default launches (PDL) and
    plain ones, on the row's inputs: 0 when they give the same numbers, as the tests require."""
    results = []
    for config, pdl in ((None, True), (nopdl_config(x, mode), False)):
        pool = x["pool"].clone()
        o, f = G.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], pool, x["slots"], x["parents"],
                                 use_qk_l2norm_in_kernel=True, input_precision=mode, config=config,
                                 launch_dependents=pdl)
        G.gdn_tree_commit(pool, x["slots"], f, x["parents"], x["accepted"], input_precision=mode, pdl=pdl)
        results.append((o, f.delta, pool))
    return max(rel_err(a, b) for a, b in zip(results[1], results[0]))


def errors(x, mode: str, sub: int, mod=G, config=None) -> tuple[float, float]:
    """Relative errors of outputs and committed state against float64, on the first ``sub`` requests, run with
    ``config`` or the launch config of the row's whole batch (the timed pipeline: split at large B). ``mod``: the
    gdn_tree module (a probe's variant)."""
    config = config or row_config(x, mode, mod)
    args, pool, slots, parents = first_requests(x, sub)
    o, f = mod.gdn_tree_verify(*args, pool, slots, parents, use_qk_l2norm_in_kernel=True, input_precision=mode,
                               config=config)
    accepted = x["accepted"][:sub]
    ro, rf, ref_pool = closed_form64(x, sub)
    mod.gdn_tree_commit(pool, slots, f, parents, accepted, input_precision=mode)
    rs = R.gdn_tree_commit_ref(ref_pool, slots, rf, parents, accepted)
    return rel_err(o, ro), rel_err(pool, rs)


def first_requests(x, sub: int):
    """The first ``sub`` requests of a row's inputs as their own batch: ``(q, k, v, g, beta)``, a copy of their
    states as a ``[sub, HV, K, V]`` pool, its slots ``0 .. sub - 1`` and their parents."""
    pool = x["pool"][x["slots"][:sub].long()].clone()  # [sub, HV, K, V]
    slots = torch.arange(sub, dtype=torch.int32, device=DEVICE)
    return [x[n][:sub] for n in ("q", "k", "v", "g", "beta")], pool, slots, x["parents"][:sub]


def closed_form64(x, sub: int):
    """The float64 closed form of :func:`first_requests`: outputs, factors and the float64 pool it started from."""
    args, pool, slots, parents = first_requests(x, sub)
    pool = pool.double()
    ro, rf = R.gdn_tree_closed_form_ref(*[t.double() for t in args], pool, slots, parents, use_qk_l2norm=True)
    return ro, rf, pool


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """``|got - want| / |want|`` (Frobenius norms, float64)."""
    want = want.double()
    return float((got.double() - want).norm() / want.norm())


def torch16_error(x, sub: int) -> float:
    """With 16-bit q / k / v: the relative output error of a torch implementation of the same math in that dtype
    (one state per node, level by level, the state pool and gates cast too) against float64 on the same inputs, on
    the first ``sub`` requests: the yardstick of the bf16 target (ours within 2x of it)."""
    dtype = x["q"].dtype
    args, pool, slots, parents = first_requests(x, sub)
    o16 = R.gdn_tree_pernode_ref(*[t.to(dtype) for t in args], pool.to(dtype), slots, parents,
                                 use_qk_l2norm=True)[0]
    return rel_err(o16, closed_form64(x, sub)[0])


def fla_fns(x, fla):
    B, N = x["parents"].shape
    S0 = x["pool"][x["slots"].long()].contiguous()  # [B, HV, K, V]
    q1, k1, v1 = x["q"][:, :1].contiguous(), x["k"][:, :1].contiguous(), x["v"][:, :1].contiguous()
    g1, b1 = x["g"][:, :1].contiguous(), x["beta"][:, :1].contiguous()

    def ar():
        # beta by keyword: fla 0.6.0's fifth parameter is gk (a per-key gate); passed there, beta faulted or gave
        # wrong outputs in every run before the thirteenth session (bench/RESULTS.md)
        return fla.fused_recurrent_gated_delta_rule(q1, k1, v1, g=g1, beta=b1, initial_state=S0,
                                                    output_final_state=True, use_qk_l2norm_in_kernel=True)

    # branch by branch: every root-to-leaf path as one varlen sequence starting from its request's S0
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
    # every path padded at its end to the longest: g = 0, beta = 0 there leave the state unchanged (alpha = 1, no
    # write), so a plain batched fused_recurrent over [paths, T] replaces the varlen call (which faulted at this size
    # while beta was passed into gk: see bench/RESULTS.md; not tried since)
    T = max(len(p) for p in paths)
    node = torch.tensor([p + [p[-1]] * (T - len(p)) for p in paths], device=DEVICE)  # [L, T]
    live = torch.tensor([[t < len(p) for t in range(T)] for p in paths], device=DEVICE)  # [L, T]
    owner_t = torch.tensor(owner, device=DEVICE)  # [L]
    req = owner_t[:, None].expand(-1, T)  # [L, T]

    def branch():
        qb, kb, vb = (x[n][req, node] for n in ("q", "k", "v"))  # [L, T, H or HV, K or V]
        gb = x["g"][req, node] * live[..., None]  # [L, T, HV]
        bb = x["beta"][req, node] * live[..., None]
        return fla.fused_recurrent_gated_delta_rule(qb, kb, vb, g=gb, beta=bb, initial_state=S0[owner_t],
                                                    output_final_state=True, use_qk_l2norm_in_kernel=True)

    branch.paths = (paths, owner)

    def chunk():
        return fla.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=S0,
                                          output_final_state=True, use_qk_l2norm_in_kernel=True)

    return ar, branch, chunk, len(paths)


def fla_jobs(shapes, kinds) -> list[list]:
    """The fla baselines to time, as ``[method, B, N, kind]``: the decode step per B, the chunk kernel on every
    chain, branch by branch on every random / eagle tree (last: the heaviest)."""
    jobs = [["ar", B, 64, "random"] for B in dict.fromkeys(B for B, _ in shapes)]
    jobs += [["chunk", B, N, "chain"] for B, N in shapes if "chain" in kinds]
    jobs += [["branch", B, N, kind] for B, N in shapes for kind in ("random", "eagle") if kind in kinds]
    return jobs


def fla_child(job_path: str, out_path: str) -> int:
    """Time the fla jobs of ``job_path`` (``{"dtype": name in DTYPES, "jobs": [...]}``) not yet in ``out_path`` in
    this process, saving after each one (a CUDA fault in fla kills this process only; the parent records the job
    and starts a new child for the rest)."""
    import fla.ops.gated_delta_rule as fla  # noqa: PLC0415

    spec = json.load(open(job_path))
    jobs, dtype = spec["jobs"], DTYPES[spec["dtype"]]
    done = json.load(open(out_path)) if os.path.exists(out_path) else {}
    for job in jobs:
        key = "/".join(map(str, job))
        if key in done:
            continue
        done[key] = dict(status="running")
        json.dump(done, open(out_path, "w"))
        method, B, N, kind = job
        x = make_inputs(B, N, kind, seed=B * 1000 + N, dtype=dtype)
        fn = dict(zip(FLA_METHODS, fla_fns(x, fla)[:3]))[method]
        us, graph_ok = graph_time(fn, rep_ms=60 if method != "ar" else 100)
        done[key] = dict(status="ok", us=us, graph=graph_ok, MiB=peak_mib(fn) if method != "ar" else None)
        done[key]["err_o"] = fla_error(x, method, fn)
        json.dump(done, open(out_path, "w"))
        print(f"fla {key}: {us:.1f} us", flush=True)
        del x, fn
        torch.cuda.empty_cache()
    return 0


def fla_error(x, method: str, fn, sub: int = 2) -> float:
    """Relative error of an fla baseline's outputs for the first ``sub`` requests against the float64 closed form
    of their trees: the decode step's against the roots', the chunk kernel's against every node's (chains), branch
    by branch every path's step t against its t-th node's."""
    args = [x[n][:sub].double() for n in ("q", "k", "v", "g", "beta")]
    ro, _ = R.gdn_tree_closed_form_ref(*args, x["pool"].double(), x["slots"][:sub], x["parents"][:sub],
                                       use_qk_l2norm=True)  # [sub, N, HV, V]
    o = fn()[0]
    if method == "ar":
        return rel_err(o[:sub, 0], ro[:, 0])
    if method == "chunk":
        return rel_err(o[:sub], ro)
    return branch_error(o, fn.paths, ro)


def branch_error(o, paths, ro) -> float:
    """Relative error of branch-by-branch outputs ``o: [L, T, HV, V]`` (``paths``: the paths and their requests)
    against the closed form ``ro: [sub, N, HV, V]`` of the first requests: path step t is its t-th node's output."""
    paths, owner = paths
    got, want = [], []
    for p, (path, b) in enumerate(zip(paths, owner)):
        if b < ro.shape[0]:
            got.append(o[p, : len(path)].double())
            want.append(ro[b, path])
    return rel_err(torch.cat(got), torch.cat(want))


def fla_baselines(jobs: list[list], dtype: str, budget_s: float, log) -> dict[str, dict]:
    """Run :func:`fla_child` until every job has a result (``status`` ok or the tail of the error that ended its
    child), or the time budget is spent."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    tmp = tempfile.mkdtemp()
    job_path, out_path = os.path.join(tmp, "jobs.json"), os.path.join(tmp, "out.json")
    json.dump(dict(dtype=dtype, jobs=jobs), open(job_path, "w"))
    start = time.time()
    results: dict[str, dict] = {}
    for _ in range(len(jobs)):
        left = budget_s - (time.time() - start)
        if left <= 10:
            break
        try:
            proc = subprocess.run([sys.executable, __file__, "--fla-child", job_path, out_path], capture_output=True,
                                  text=True, timeout=left)
            rc, text = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc, text = "timeout", f"{exc.stdout or ''}{exc.stderr or ''}"
        results = json.load(open(out_path)) if os.path.exists(out_path) else {}
        died_in = [key for key, r in results.items() if r.get("status") == "running"]  # the job this child died in
        for key in died_in:
            results[key].update(status="failed", error=str(text)[-800:])
            log(f"fla {key}: FAILED (rc {rc}): {str(text)[-300:]}")
        json.dump(results, open(out_path, "w"))
        if rc == 0 or rc == "timeout" or not died_in:  # done, out of time, or failing before any job (no fla)
            if rc != 0 and not died_in:
                log(f"fla baselines not run (rc {rc}): {str(text)[-300:]}")
            break
    for job in jobs:
        results.setdefault("/".join(map(str, job)), dict(status="not run"))
    return results


def pernode_fn(x):
    levels = [tuple(t.to(DEVICE) for t in lv) for lv in R.tree_levels(x["parents"])]

    def pernode():
        return R.gdn_tree_pernode_ref(x["q"], x["k"], x["v"], x["g"], x["beta"], x["pool"], x["slots"],
                                      x["parents"], use_qk_l2norm=True, levels=levels, return_states=False)

    return pernode


def io_bytes(B: int, N: int, elt: int = 4) -> dict[str, float]:
    state = B * HV * K * V * 4
    tokens_in = B * N * (2 * H * K + HV * V) * elt + 2 * B * N * HV * 4
    tokens_out = B * N * HV * V * (elt + 4) + B * N * (HV + H) * 4  # o, delta, log_gamma, k_rnorm
    return dict(state=state, verify=state + tokens_in + tokens_out, commit=2 * state)


def flops(B: int, N: int, levels: int) -> dict[str, float]:
    """Useful FLOPs of verify (closed form with a forward-substitution solve) and those our kernel executes with
    one program per (request, value head) over all V columns (explicit-T doubling, `levels` factors)."""
    useful = 2 * B * HV * (2 * N * N * K + 2 * N * K * V + N * N * V / 2 + N * N * V)
    NP = max(16, triton.next_power_of_2(N))
    executed = 2 * B * HV * (2 * NP * NP * K + 2 * NP * K * V + 2 * max(levels - 1, 0) * NP**3 + 2 * NP * NP * V)
    return dict(useful=useful, executed_bv_full=executed)


# -------------------------------------------------------------------------------------------------------------- main
def run_sweep(log) -> list[dict]:
    out = []
    for B, N, mode in [(64, 64, "tf32"), (64, 64, "ieee"), (1, 64, "tf32"), (64, 128, "tf32"), (1, 128, "tf32"),
                       (64, 32, "tf32")]:
        x = make_inputs(B, N, "random", seed=1)
        NP = max(16, triton.next_power_of_2(N))
        for cfg in SWEEP:
            cfg = cfg._replace(solve_warps=4 if NP <= 32 else 8 if NP <= 64 else 16)
            try:
                verify, _, _, _, _ = ours_fns(x, mode, cfg)
                us, _ = graph_time(verify, rep_ms=60)
            except Exception as exc:  # noqa: BLE001 - a config that fails to compile (registers) is recorded
                us = float("nan")
                log(f"sweep B={B} N={N} {mode} {tuple(cfg)}: {type(exc).__name__}: {str(exc)[:120]}")
            out.append(dict(B=B, N=N, mode=mode, config=list(cfg), verify_us=us))
            log(f"sweep B={B:3d} N={N:3d} {mode:6s} cfg={tuple(cfg)} verify {us:8.1f} us")
        default = row_config(x, mode)
        log(f"sweep default for B={B} N={N}: {tuple(default)}")
        if mode == "tf32" and N == 64:
            for cfg in COMMIT_SWEEP:
                _, commit, _, _, _ = ours_fns(x, mode)
                pool_work, factors, meta = commit.state
                us, _ = graph_time(lambda: G.gdn_tree_commit(pool_work, x["slots"], factors, x["parents"],
                                                             x["accepted"], input_precision=mode, meta=meta,
                                                             validate=False, config=cfg), rep_ms=60)
                out.append(dict(B=B, N=N, mode=mode, commit_config=list(cfg), commit_us=us))
                log(f"sweep B={B:3d} N={N:3d} commit cfg={tuple(cfg)} {us:8.1f} us")
        del x
        torch.cuda.empty_cache()
    return out


def batch_and_nodes(text: str) -> tuple[int, int]:
    """``"64x128"`` -> ``(64, 128)`` (``--shapes``)."""
    try:
        B, N = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape {text!r}: want BxN, e.g. 64x128") from None
    if B < 1 or not 1 <= N <= G.MAX_NODES:
        raise argparse.ArgumentTypeError(f"shape {text!r}: B >= 1 and 1 <= N <= {G.MAX_NODES}")
    return B, N


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gdn_tree_results.json")
    parser.add_argument("--quick", action="store_true", help="(B, N) in {(64, 64), (1, 64)} only")
    parser.add_argument("--shapes", nargs="+", type=batch_and_nodes, default=None, metavar="BxN",
                        help="these (B, N) shapes in this order (e.g. 64x128 1x128) instead of every one")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES, help="precision modes to time")
    parser.add_argument("--kinds", nargs="+", default=["random", "eagle", "chain", "star"],
                        choices=["random", "eagle", "chain", "star"], help="tree kinds (the first is the headline)")
    parser.add_argument("--sweep", action="store_true", help="time the launch-config sweep first")
    parser.add_argument("--budget-s", type=float, default=1e9, help="stop starting new rows after this many seconds")
    parser.add_argument("--err-sub", type=int, default=4, help="requests checked against float64 per row")
    parser.add_argument("--fla-budget-s", type=float, default=240.0, help="time for the fla baselines (phase 0)")
    parser.add_argument("--fla-shapes", type=int, default=5, help="fla baselines for the first this many (B, N)")
    parser.add_argument("--dtype", default="fp32", choices=list(DTYPES), help="q, k, v dtype (gates, state fp32)")
    parser.add_argument("--fla-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fla_child:
        return fla_child(*args.fla_child)
    start = time.time()

    lines: list[str] = []

    def log(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)

    result: dict = dict(card=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                        date=time.strftime("%Y-%m-%d"), shapes=dict(H=H, HV=HV, K=K, V=V), dtype=args.dtype,
                        rows=[])
    try:
        import importlib.metadata as md  # noqa: PLC0415

        result["fla"] = md.version("fla-core")
    except Exception:  # noqa: BLE001
        result["fla"] = "unknown"
    bw = copy_bandwidth()
    result["copy_TBps"] = bw / 1e12
    result["tf32_TFLOPs"] = matmul_tf32_rate() / 1e12
    log(f"card {result['card']}  copy {bw / 1e12:.2f} TB/s  tf32 matmul {result['tf32_TFLOPs']:.0f} TFLOP/s")

    def save() -> None:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1)

    # most important first: a budget cut drops the rest
    shapes = args.shapes or ([(64, 64), (1, 64)] if args.quick else PRIORITY)
    kinds = tuple(args.kinds)
    # phase 0: the fla baselines, in child processes (a fault in a peer must not take this process's CUDA context
    # with it)
    result["fla_runs"] = fla = fla_baselines(fla_jobs(shapes[: args.fla_shapes], kinds), args.dtype,
                                                args.fla_budget_s, log)
    save()
    start = time.time()  # --budget-s counts from here: our rows
    if args.sweep:
        result["sweep"] = run_sweep(log)
        save()

    def fla_get(row: dict, method: str, B: int, N: int, kind: str) -> None:
        r = fla.get(f"{method}/{B}/{N}/{kind}")
        if r is None:
            return
        if r["status"] == "ok":
            row[f"{method}_us"], row[f"{method}_graph"] = r["us"], r["graph"]
            if r.get("MiB") is not None:
                row[f"{method}_MiB"] = r["MiB"]
            if "err_o" in r:
                row[f"{method}_err_o"] = r["err_o"]  # its outputs against float64, as ours
        else:
            row[f"{method}_status"] = r["status"]

    dtype = DTYPES[args.dtype]
    for B, N in shapes:
        for kind in kinds:
            if time.time() - start > args.budget_s:
                log(f"budget reached: skipping B={B} N={N} {kind}")
                continue
            row = dict(B=B, N=N, kind=kind)
            try:
                x = make_inputs(B, N, kind, seed=B * 1000 + N, dtype=dtype)
                row["max_depth"] = x["max_depth"]
                levels = int(x["max_depth"]).bit_length()
                row.update(flops=flops(B, N, levels), bytes=io_bytes(B, N, x["q"].element_size()))
                row["floor_us"] = 2 * B * HV * K * V * 4 / bw * 1e6
                row["io_floor_us"] = (row["bytes"]["verify"] + row["bytes"]["commit"]) / bw * 1e6
                meta_us, _ = graph_time(lambda: G.tree_meta(x["parents"], validate=False), rep_ms=40)
                row["meta_us"] = meta_us
                for mode in args.modes:
                    verify, commit, both, nopdl, _ = ours_fns(x, mode)
                    row[f"ours_{mode}_us"], row[f"ours_{mode}_graph"] = graph_time(both)
                    row[f"nopdl_{mode}_us"], _ = graph_time(nopdl)
                    row[f"nopdl_diff_{mode}"] = nopdl_difference(x, mode)
                    row[f"verify_{mode}_us"], _ = graph_time(verify, rep_ms=60)
                    row[f"commit_{mode}_us"], _ = graph_time(commit, rep_ms=60)
                    if mode == "tf32":
                        row["ours_MiB"] = peak_mib(both)
                        row["o_MiB"] = x["v"].numel() * x["v"].element_size() / 2**20  # every method writes o
                    sub = min(B, args.err_sub)
                    row[f"err_o_{mode}"], row[f"err_s_{mode}"] = errors(x, mode, sub)
                    if x["q"].element_size() == 2 and "err_o_torch16" not in row:
                        row["err_o_torch16"] = torch16_error(x, sub)
                    other = other_config(x, mode)
                    if other is not None:  # a small batch: the other verify form side by side
                        name, config = other
                        row[f"{name}_{mode}_us"], _ = graph_time(ours_fns(x, mode, config)[2])
                        row[f"{name}_err_o_{mode}"], row[f"{name}_err_s_{mode}"] = errors(x, mode, sub, config=config)
                row["leaves"] = x["leaves"]
                fla_get(row, "ar", B, 64, "random")
                if kind == "chain":
                    fla_get(row, "chunk", B, N, kind)
            except Exception as exc:  # noqa: BLE001 - keep the rest of the run
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            result["rows"].append(row)
            log(summary_line(row))
            save()
            torch.cuda.empty_cache()
    # phase 2: the heavy baselines (a crash there must not cost the rows above, which are saved already)
    for row in result["rows"]:
        if "error" in row or row["kind"] not in ("random", "eagle") or time.time() - start > args.budget_s:
            continue
        B, N = row["B"], row["N"]
        try:
            x = make_inputs(B, N, row["kind"], seed=B * 1000 + N, dtype=dtype)
            fla_get(row, "branch", B, N, row["kind"])
            if B * N <= 64 * 64:
                pernode = pernode_fn(x)
                row["pernode_us"], row["pernode_graph"] = graph_time(pernode, rep_ms=60)
                row["pernode_MiB"] = peak_mib(pernode)
        except Exception as exc:  # noqa: BLE001
            row["baseline_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        log(summary_line(row))
        save()
        del x
        torch.cuda.empty_cache()
    log("")
    for line in ratio_table(result["rows"]):
        log(line)
    result["log"] = lines
    save()
    return 0


def summary_line(r: dict) -> str:
    if "error" in r:
        return f"B={r['B']:3d} N={r['N']:3d} {r['kind']:6s} ERROR {r['error']}"
    extra = "".join(f" {m}={r[f'{m}_us']:.1f}" for m in ("branch", "pernode", "chunk") if f"{m}_us" in r)
    extra += "".join(f" {m}_err={r[f'{m}_err_o']:.1e}" for m in FLA_METHODS if f"{m}_err_o" in r)
    extra += f" torch16_err={r['err_o_torch16']:.1e}" if "err_o_torch16" in r else ""
    extra += "".join(f" {f} {m}={r[f'{f}_{m}_us']:.1f} (err {r[f'{f}_err_o_{m}']:.1e})" for f in ("split", "fused")
                     for m in MODES if f"{f}_{m}_us" in r)
    r = {"ar_us": math.nan, **{f"{p}_{m}_us": math.nan for p in ("ours", "verify", "commit", "nopdl")
                               for m in MODES},
         **{f"err_{w}_{m}": math.nan for w in "os" for m in MODES}, **r}
    return (f"B={r['B']:3d} N={r['N']:3d} {r['kind']:6s} depth={r['max_depth']:3d} ar={r['ar_us']:.1f} "
            f"ours tf32={r['ours_tf32_us']:.1f} (v {r['verify_tf32_us']:.1f} c {r['commit_tf32_us']:.1f}; "
            f"without PDL {r['nopdl_tf32_us']:.1f}) "
            f"tf32x3={r['ours_tf32x3_us']:.1f} ieee={r['ours_ieee_us']:.1f} floor={r['floor_us']:.1f} "
            f"io_floor={r['io_floor_us']:.1f} meta={r['meta_us']:.1f}{extra} "
            f"err tf32={r['err_o_tf32']:.1e}/{r['err_s_tf32']:.1e} ieee={r['err_o_ieee']:.1e}/{r['err_s_ieee']:.1e}")


def ratio_table(rows: list[dict]) -> list[str]:
    out = ["| B | N | tree | depth | ours tf32 (us) | no PDL tf32 (us) | ours ieee (us) | /AR tf32"
           " | /AR no PDL | /AR ieee | branch/ours | pernode/ours | chunk/ours | err tf32 | err ieee"
           " | memory / per-node (without o) | 16-bit o err: ours tf32 / torch |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            continue
        get = lambda key: r.get(key, math.nan)  # noqa: E731 - a mode left out of the run
        t, i, ar = get("ours_tf32_us"), get("ours_ieee_us"), get("ar_us")
        d = get("nopdl_tf32_us")
        ratio = lambda key: f"{r[key] / t:.1f}x" if key in r else "-"  # noqa: E731
        out.append(f"| {r['B']} | {r['N']} | {r['kind']} | {r['max_depth']} | {t:.1f} | {d:.1f} | {i:.1f} | "
                   f"{t / ar:.2f} | {d / ar:.2f} | {i / ar:.2f} | {ratio('branch_us')} | "
                   f"{ratio('pernode_us')} | {ratio('chunk_us')} | "
                   f"{max(get('err_o_tf32'), get('err_s_tf32')):.1e} | "
                   f"{max(get('err_o_ieee'), get('err_s_ieee')):.1e} | {memory_share(r)} | {torch16_share(r)} |")
    return out


def torch16_share(r: dict) -> str:
    """With 16-bit inputs: our tf32 output error over the torch 16-bit implementation's (the target: <= 2x),
    '1.7e-03 / 2.5e-03 = 0.68x'."""
    if "err_o_torch16" not in r or "err_o_tf32" not in r:
        return "-"
    ours, theirs = r["err_o_tf32"], r["err_o_torch16"]
    return f"{ours:.1e} / {theirs:.1e} = {ours / theirs:.2f}x"


def memory_share(r: dict) -> str:
    """Our peak transient memory as a share of the per-node baseline's, as allocated and without the output o
    (which both allocate): '1.46 % (0.88 %)'."""
    if "ours_MiB" not in r or "pernode_MiB" not in r:
        return "-"
    o = r["o_MiB"]
    return (f"{100 * r['ours_MiB'] / r['pernode_MiB']:.2f} % "
            f"({100 * (r['ours_MiB'] - o) / (r['pernode_MiB'] - o):.2f} %)")


if __name__ == "__main__":
    raise SystemExit(main())
