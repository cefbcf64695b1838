"""Probe: the GDN tree verify / commit variants against the library defaults, one GPU, one short run.

For (B, N) in {(1, 64), (16, 64), (64, 64), (64, 128)} at Qwen3-Next shapes (H=16, HV=32, K=V=128), tf32 and ieee
(fp32 inputs), and bf16 inputs at (64, 64) in tf32, in priority order:

- every verify variant (a :class:`~lumotree.optimized.gdn_tree.KernelConfig`, ``default`` = ``verify_config``) and
  every commit variant (``default`` = ``commit_config``), each checked against a float64 torch closed form (outputs,
  delta, committed state of the first requests) in the same run, then timed alone (CUDA-graph replay, median of
  ``triton.testing.do_bench``);
- together: default verify + default commit, and the fastest correct verify + the fastest correct commit;
- ``floor_us``: a copy of the batch's states (read S0 + write S), timed the same way in the same run.

Every variant runs in its own try/except (errors recorded, the run goes on); variants still waiting when the wall
budget (``--budget``, default 150 s, compilation included) runs out are recorded as skipped.

Run (GPU): ``PYTHONPATH=$PWD python bench/gdn_probe.py --out gdn_probe.json``.
Interpreter smoke test (CPU, tiny shapes): ``PYTHONPATH=$PWD python bench/gdn_probe.py --tiny --out /tmp/p.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

if "--tiny" in sys.argv and not os.environ.get("TRITON_INTERPRET"):
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gdn_tree as bench_gdn  # noqa: E402  bench/gdn_tree.py: make_tree, depths, graph_time

from lumotree.optimized import gdn_tree as G  # noqa: E402
from lumotree.optimized import gdn_tree_ref as R  # noqa: E402

KC = G.KernelConfig
# name -> verify config (KernelConfig(block_v, block_k, num_warps, num_stages, ...)); "_vec": the fused kernel reading
# the ancestor words as vectors (A/B against the defaults). The per-(request, value head) kernel timed in run 3
# (bench/results/2026-11-29-h200-gdn-probe.json) lost everywhere and was removed.
VERIFY_LARGE = {
    "fused_bv64_bk32_w4_vec": KC(64, 32, 4, 2, split=False, word_vectors=True),
}
VERIFY_SMALL = {
    "fused_bv16_bk32_w4": KC(16, 32, 4, 2, split=False),
    "fused_bv16_bk32_w4_vec": KC(16, 32, 4, 2, split=False, word_vectors=True),
    "fused_bv32_bk32_w4_vec": KC(32, 32, 4, 2, split=False, word_vectors=True),  # the B=1 default + word vectors
    "split_bv16_bk32_w4": KC(16, 32, 4, 2, split=True),
    "fused_bv32_bk32_w4_tma": KC(32, 32, 4, 3, split=False, tma=True),  # the tiles through tensor descriptors
}
COMMIT_LARGE = {
    "bv64_bk32_w4": KC(64, 32, 4, 1),
    "bv128_bk32_w4": KC(128, 32, 4, 1),
    "bv64_bk64_w4": KC(64, 64, 4, 1),
}
COMMIT_SMALL = {
    "bv32_bk32_w2": KC(32, 32, 2, 1),
    "bv64_bk32_w4": KC(64, 32, 4, 1),
    "bv32_bk64_w4": KC(32, 64, 4, 1),
}
# fewer variants where a run is less informative (compilation is most of the budget)
VERIFY_REDUCED = ("fused_bv64_bk32_w4_vec",)
COMMIT_REDUCED = ("bv64_bk32_w4", "bv32_bk32_w2")
TOLERANCE = {"tf32": 2e-3, "tf32x3": 1e-5, "ieee": 1e-5}


def workloads(tiny: bool) -> list[dict]:
    """(B, N, precision, dtype, reduced) in priority order (the targets first; B=16 reuses B=64's compiled
    kernels; ``reduced``: fewer variants where every kernel is compiled anew for little news)."""
    if tiny:
        return [dict(B=1, N=8, precision="tf32", dtype=torch.float32, reduced=False),
                dict(B=3, N=12, precision="ieee", dtype=torch.float32, reduced=False),
                dict(B=2, N=8, precision="tf32", dtype=torch.bfloat16, reduced=True)]
    out = [dict(B=64, N=64, precision="tf32", dtype=torch.float32, reduced=False),
           dict(B=1, N=64, precision="tf32", dtype=torch.float32, reduced=False),
           dict(B=64, N=64, precision="tf32", dtype=torch.bfloat16, reduced=True),
           dict(B=16, N=64, precision="tf32", dtype=torch.float32, reduced=False)]
    out += [dict(B=B, N=N, precision="ieee", dtype=torch.float32, reduced=True)
            for B, N in ((64, 64), (1, 64), (16, 64))]
    out += [dict(B=64, N=128, precision=p, dtype=torch.float32, reduced=True) for p in ("tf32", "ieee")]
    return out


def make_inputs(B: int, N: int, dims: tuple, dtype, device: str, seed: int) -> dict:
    """Random trees (up to 4 children a node) and GDN inputs; accepted node at about half the max depth."""
    H, HV, K, V = dims
    rng = np.random.default_rng(seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    rows = [bench_gdn.make_tree("random", N, rng) for _ in range(B)]
    parents = torch.tensor(rows, dtype=torch.int32, device=device)  # [B, N]
    q = torch.randn(B, N, H, K, device=device, generator=gen).to(dtype)  # [B, N, H, K]
    k = torch.randn(B, N, H, K, device=device, generator=gen).to(dtype)  # [B, N, H, K]
    v = torch.randn(B, N, HV, V, device=device, generator=gen).to(dtype)  # [B, N, HV, V]
    a = torch.randn(B, N, HV, device=device, generator=gen)  # [B, N, HV]
    b = torch.randn(B, N, HV, device=device, generator=gen)  # [B, N, HV]
    A_log = torch.log(torch.empty(HV, device=device).uniform_(1, 16, generator=gen))  # [HV]
    dt_bias = torch.randn(HV, device=device, generator=gen) * 0.5  # [HV]
    g, beta = R.gdn_gates_ref(a, b, A_log, dt_bias)  # [B, N, HV] each
    pool = torch.randn(B + 1, HV, K, V, device=device, generator=gen) * 0.1  # [P, HV, K, V]
    slots = torch.randperm(B + 1, device=device, generator=gen)[:B].to(torch.int32)  # [B]
    dep = [bench_gdn.depths(r) for r in rows]
    accepted = torch.tensor([int(np.argmin([abs(x - max(d) // 2) for x in d])) for d in dep], dtype=torch.int32,
                            device=device)  # [B]
    return dict(parents=parents, q=q, k=k, v=v, g=g, beta=beta, pool=pool, slots=slots, accepted=accepted,
                meta=G.tree_meta(parents), max_depth=max(max(d) for d in dep))


def oracle(x: dict, sub: int) -> dict:
    """Float64 closed form on the first ``sub`` requests (same input values as the kernels see)."""
    s = slice(0, sub)
    slots = x["slots"][s]
    args = [x[n][s].double() for n in ("q", "k", "v", "g", "beta")]
    pool = x["pool"].double()
    o, f = R.gdn_tree_closed_form_ref(*args, pool, slots, x["parents"][s], use_qk_l2norm=True)
    state = R.gdn_tree_commit_ref(pool, slots, f, x["parents"][s], x["accepted"][s])  # [sub, HV, K, V]
    return dict(o=o, delta=f.delta, state=state)


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    a = a.double()
    if not bool(torch.isfinite(a).all()):
        return float("inf")
    return float((a - ref).norm() / ref.norm().clamp_min(1e-300))


class Timer:
    """CUDA-graph replay median on the GPU (bench/gdn_tree.graph_time); one wall-clock call under the interpreter."""

    def __init__(self, gpu: bool, rep_ms: int):
        self.gpu, self.rep_ms = gpu, rep_ms

    def __call__(self, fn) -> float:
        if self.gpu:
            us, _ = bench_gdn.graph_time(fn, rep_ms=self.rep_ms)
            torch.cuda.synchronize()
            return us
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6

    def sync(self) -> None:
        if self.gpu:
            torch.cuda.synchronize()


def verify_call(x: dict, pool: torch.Tensor, precision: str, config, out=None):
    return G.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], pool, x["slots"], x["parents"],
                             use_qk_l2norm_in_kernel=True, input_precision=precision, meta=x["meta"],
                             validate=False, config=config, out=out)


def commit_call(x: dict, pool: torch.Tensor, factors, precision: str, config) -> None:
    G.gdn_tree_commit(pool, x["slots"], factors, x["parents"], x["accepted"], input_precision=precision,
                      meta=x["meta"], validate=False, config=config)


def poisoned_out(x: dict) -> tuple:
    B, N, H, _ = x["q"].shape
    HV, V = x["v"].shape[2:]
    dev = x["q"].device
    return (torch.full((B, N, HV, V), float("nan"), dtype=x["v"].dtype, device=dev),
            torch.full((B, N, HV, V), float("nan"), device=dev),
            torch.full((B, N, HV), float("nan"), device=dev),
            torch.full((B, N, H), float("nan"), device=dev))


def probe_workload(w: dict, dims: tuple, device: str, timer: Timer, sub: int, deadline: float, log) -> list[dict]:
    B, N, precision, dtype = w["B"], w["N"], w["precision"], w["dtype"]
    tag = dict(B=B, N=N, precision=precision, dtype=str(dtype).replace("torch.", ""))
    rows: list[dict] = []
    x = make_inputs(B, N, dims, dtype, device, seed=1000 * B + N)
    ref = oracle(x, min(sub, B))
    tol = TOLERANCE[precision]
    tol_o = max(tol, 8e-3) if dtype == torch.bfloat16 else tol  # o is stored in the inputs' dtype
    s = slice(0, min(sub, B))
    sms = torch.cuda.get_device_properties(0).multi_processor_count if timer.gpu else 2
    small = B * dims[1] < 2 * sms  # the library's own switch (verify_config): too few (request, head) programs
    verify_variants = {"default": None, **(VERIFY_SMALL if small else VERIFY_LARGE)}
    commit_variants = {"default": None, **(COMMIT_SMALL if small else COMMIT_LARGE)}
    if w["reduced"]:
        verify_variants = {n: c for n, c in verify_variants.items() if n == "default" or n in VERIFY_REDUCED}
        commit_variants = {n: c for n, c in commit_variants.items() if n == "default" or n in COMMIT_REDUCED}

    # state floor: read S0 + write S of the batch, a plain copy in the same run
    row = dict(tag, kind="floor", variant="copy")
    try:
        src = x["pool"][: B].clone()
        dst = torch.empty_like(src)
        row["us"] = timer(lambda: dst.copy_(src))
        del src, dst
    except Exception as exc:  # noqa: BLE001
        row["error"] = f"{type(exc).__name__}: {exc}"[:400]
    timer.sync()
    rows.append(row)
    floor_us = row.get("us", float("nan"))

    work_pool = x["pool"].clone()
    factors_default = None
    for name, cfg in verify_variants.items():
        row = dict(tag, kind="verify", variant=name, config=None if cfg is None else cfg._asdict(), floor_us=floor_us)
        if time.time() > deadline:
            rows.append(dict(row, skipped="wall budget"))
            continue
        try:
            t0 = time.time()
            out = poisoned_out(x)
            o, f = verify_call(x, work_pool, precision, cfg, out=out)
            timer.sync()
            row["first_call_s"] = round(time.time() - t0, 2)  # compile + run
            row["err_o"] = rel(o[s], ref["o"])
            row["err_delta"] = rel(f.delta[s], ref["delta"])
            row["ok"] = row["err_o"] < tol_o and row["err_delta"] < tol and bool(torch.isfinite(o).all())
            if name == "default":
                factors_default = f
            row["us"] = timer(lambda cfg=cfg: verify_call(x, work_pool, precision, cfg))
        except Exception as exc:  # noqa: BLE001 - record and go on
            row["error"] = f"{type(exc).__name__}: {exc}"[-400:]
        timer.sync()
        rows.append(row)
        log(row)

    for name, cfg in commit_variants.items():
        row = dict(tag, kind="commit", variant=name, config=None if cfg is None else cfg._asdict(), floor_us=floor_us)
        if time.time() > deadline or factors_default is None:
            rows.append(dict(row, skipped="wall budget" if factors_default is not None else "no default verify"))
            continue
        try:
            t0 = time.time()
            pool = x["pool"].clone()
            commit_call(x, pool, factors_default, precision, cfg)
            timer.sync()
            row["first_call_s"] = round(time.time() - t0, 2)
            row["err_s"] = rel(pool[x["slots"][s].long()], ref["state"])
            untouched = torch.ones(pool.shape[0], dtype=torch.bool, device=pool.device)
            untouched[x["slots"].long()] = False
            row["ok"] = row["err_s"] < tol and bool(torch.equal(pool[untouched], x["pool"][untouched]))
            row["us"] = timer(lambda cfg=cfg: commit_call(x, work_pool, factors_default, precision, cfg))
        except Exception as exc:  # noqa: BLE001
            row["error"] = f"{type(exc).__name__}: {exc}"[-400:]
        timer.sync()
        rows.append(row)
        log(row)

    # together: defaults, and the fastest correct verify with the fastest correct commit
    def fastest(kind: str) -> str | None:
        done = [r for r in rows if r["kind"] == kind and r.get("ok") and "us" in r]
        return min(done, key=lambda r: r["us"])["variant"] if done else None

    pairs = {("default", "default")}
    best_v, best_c = fastest("verify"), fastest("commit")
    if best_v and best_c:
        pairs.add((best_v, best_c))
    for v_name, c_name in sorted(pairs):
        row = dict(tag, kind="both", variant=f"{v_name}+{c_name}", floor_us=floor_us)
        if time.time() > deadline:
            rows.append(dict(row, skipped="wall budget"))
            continue
        try:
            v_cfg, c_cfg = verify_variants[v_name], commit_variants[c_name]

            def both(v_cfg=v_cfg, c_cfg=c_cfg):
                _, f = verify_call(x, work_pool, precision, v_cfg)
                commit_call(x, work_pool, f, precision, c_cfg)

            row["us"] = timer(both)
        except Exception as exc:  # noqa: BLE001
            row["error"] = f"{type(exc).__name__}: {exc}"[-400:]
        timer.sync()
        rows.append(row)
        log(row)
    return rows


def summary(rows: list[dict]) -> list[str]:
    lines = [f"{'B':>3} {'N':>4} {'mode':<10} {'kind':<7} {'variant':<44} {'us':>9} {'floor':>7} {'err':>9} ok"]
    for r in rows:
        if r["kind"] == "floor":
            continue
        errs = [r[k] for k in ("err_o", "err_delta", "err_s") if k in r]
        err = max(errs) if errs else float("nan")
        us = r.get("us")
        if "skipped" in r or "error" in r:
            status = r.get("skipped") or r["error"][:60]
        else:
            status = {True: "ok", False: "WRONG", None: "-"}[r.get("ok")]
        mode = r["precision"] + "/" + {"float32": "fp32", "bfloat16": "bf16"}.get(r["dtype"], r["dtype"])
        lines.append(f"{r['B']:>3} {r['N']:>4} {mode:<10} {r['kind']:<7} "
                     f"{r['variant']:<44} {us if us is not None else float('nan'):>9.1f} "
                     f"{r.get('floor_us', float('nan')):>7.1f} {err:>9.2e} {status}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gdn_probe.json")
    parser.add_argument("--tiny", action="store_true", help="CPU interpreter, tiny shapes (a smoke test)")
    parser.add_argument("--budget", type=float, default=150.0, help="wall seconds for the whole run")
    parser.add_argument("--rep-ms", type=int, default=25, help="do_bench repetition time per measurement")
    args = parser.parse_args()
    start = time.time()
    gpu = not args.tiny
    if gpu and not torch.cuda.is_available():
        print("no CUDA device: use --tiny for the interpreter smoke test", file=sys.stderr)
        return 2
    device = "cuda" if gpu else "cpu"
    dims = (1, 2, 16, 16) if args.tiny else (bench_gdn.H, bench_gdn.HV, bench_gdn.K, bench_gdn.V)
    result = dict(card=torch.cuda.get_device_name(0) if gpu else "cpu (interpreter)",
                  dims=dict(zip("H HV K V".split(), dims)),
                  torch=torch.__version__, triton=__import__("triton").__version__, budget_s=args.budget, rows=[])
    # leave ~12 % of the budget for the last variant in flight, the summary and the JSON
    deadline = start + 0.88 * args.budget
    timer = Timer(gpu, args.rep_ms)

    def save() -> None:
        result["wall_s"] = round(time.time() - start, 1)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1, default=str)

    def log(row: dict) -> None:
        keys = ("B", "N", "precision", "dtype", "kind", "variant", "us", "err_o", "err_delta", "err_s", "ok",
                "first_call_s", "error")
        print(json.dumps({k: row[k] for k in keys if k in row}, default=str), flush=True)

    if gpu:
        try:
            result["copy_TBps"] = bench_gdn.copy_bandwidth() / 1e12
        except Exception as exc:  # noqa: BLE001
            result["copy_error"] = f"{type(exc).__name__}: {exc}"[:400]
    for w in workloads(args.tiny):
        if time.time() > deadline:
            result["rows"].append(dict(B=w["B"], N=w["N"], precision=w["precision"], dtype=str(w["dtype"]),
                                       kind="workload", variant="all", skipped="wall budget"))
            continue
        try:
            result["rows"] += probe_workload(w, dims, device, timer, sub=2, deadline=deadline, log=log)
        except Exception as exc:  # noqa: BLE001 - inputs/oracle failed: record, next workload
            result["rows"].append(dict(B=w["B"], N=w["N"], precision=w["precision"], dtype=str(w["dtype"]),
                                       kind="workload", variant="all", error=f"{type(exc).__name__}: {exc}"[-400:]))
        if gpu:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        save()
    table = summary([r for r in result["rows"] if r.get("kind") != "workload"])
    result["table"] = table
    save()
    print("\n".join(table))
    print(f"wall {time.time() - start:.1f} s, json {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
