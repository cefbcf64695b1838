"""Twenty-ninth session: how much of the split apply's time is bytes, and how much its products? B = 64, N = 64,
random trees, tf32, fp32 inputs, one H200.

The default verify's apply (the solve left out, as in ``bench/gdn_profile.py``) and the default commit are set
beside a ladder of one stand-in kernel with the apply's grid, tiles, descriptors, warps and stages:

- ``bytes``: every tile the apply moves (q / k / S0 chunks, v, fp16 TB / QKD, o and Delta out), consumed by row /
  column sums instead of products: what this tiling can stream in Triton;
- ``loop``: the K loop's products ``K S0``, ``Q S0`` on the tensor cores, the epilogue by sums;
- ``full``: both epilogue products too, ``Delta = TB (V - K S0)``, ``O = Q S0 + QKD Delta`` (without the
  library's tf32 rounding, decays and norms);
- ``fold``: ``full`` with the bytes of a verify that folds in the previous step's commit: the state tile written
  back in place (unchanged: the path terms left out) and no ``Delta`` stored (the accepted path's would be
  recomputed in the next step);
- ``commit``: the fold with its arithmetic, on a copy of the pool: each state chunk becomes
  ``gamma_a S + K_p^T diag(w) Delta_p`` (a random previous path of ``PATH`` nodes) before the products use it and
  it is written back; ``Delta`` stored.

With the commit's plain read-modify-write of its tiles (``commit_probe._scale_tiles``, run 65: 87 % of the copy
rate), ``loop`` + RMW bounds what a split pipeline can reach in Triton if the solve were free and hidden
(``bytes`` turned out slower than ``loop``: its sums move every tile into registers). fla-core's decode step in
the same run gives the 2x allowance. Every kernel's output is checked against a float64 torch form of the same
math on the same (random, non-zero) data in the run.

Runs 66-69 grew the script (66: the ladder without ``fold``; 67: ``--sweep``; 68: ``fold`` and ``--fold-sweep``;
69: ``commit``, with the per-stage timing in ``_stage``). After run 69 ``_want`` takes the state from its caller
(the same references, computed once); after run 77 fla's step and the copy rate moved into ``fla_allowance``
(shared with ``../2026-12-03g/gluon_probe.py``). Untimed since.

Run: ``PYTHONPATH=$PWD:$PWD/bench:<fla> python bench/results/2026-12-03f/apply_probe.py [--out PATH]``.
"""
import argparse
import json
import os
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "2026-12-03e"))
import gdn_profile  # noqa: E402
import gdn_tree as bench_gdn  # noqa: E402
from commit_probe import _scale_tiles  # noqa: E402  run 65's read-modify-write of the commit's tiles

STAGES = {"bytes": 0, "loop": 1, "full": 2, "fold": 3, "commit": 4}
PATH = 16  # the previous step's accepted path, padded: the library commit gathers 16 nodes at a time


@triton.jit
def _apply_ladder(pool_desc, q_desc, k_desc, v_desc, tb_desc, qkd_desc, o_desc, delta_desc, slots_ptr,
                  kp_desc, dp_desc, w_ptr, ga_ptr,
                  H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, NP: tl.constexpr, BK: tl.constexpr,
                  BV: tl.constexpr, STAGE: tl.constexpr, P: tl.constexpr):
    pid_v = tl.program_id(0)  # fastest, as in the apply
    pid_bh = tl.program_id(1)
    b = pid_bh // HV
    hv = pid_bh % HV
    h = hv // (HV // H)
    slot = tl.load(slots_ptr + b)
    state_row = (slot * HV + hv) * K
    ks = tl.zeros([NP, BV], dtype=tl.float32)  # [NP, BV] K S0 (bytes: sums)
    qs = tl.zeros([NP, BV], dtype=tl.float32)  # [NP, BV] Q S0 (bytes: sums)
    if STAGE == 4:  # the previous step's commit: S0 = gamma_a S + K_p^T diag(w) Delta_p, P path nodes
        paths = tl.arange(0, P)  # [P]
        w = tl.load(w_ptr + (b * P + paths) * HV + hv)  # [P] decay ratios Gamma_a / Gamma_j
        dp_w = dp_desc.load([b, 0, hv, pid_v * BV]).reshape(P, BV) * w[:, None]  # [P, BV]
        gamma_a = tl.load(ga_ptr + pid_bh)
    for k0 in range(0, K, BK):
        q_c = q_desc.load([b, 0, h, k0]).reshape(NP, BK)  # [NP, BK]
        k_c = k_desc.load([b, 0, h, k0]).reshape(NP, BK)  # [NP, BK]
        s_c = pool_desc.load([state_row + k0, pid_v * BV])  # [BK, BV]
        if STAGE == 4:
            kp_c = kp_desc.load([b, 0, h, k0]).reshape(P, BK)  # [P, BK]
            s_c = s_c * gamma_a + tl.dot(tl.trans(kp_c), dp_w, input_precision="tf32")  # [BK, BV]
        if STAGE >= 3:  # the state tile written back: a folded commit's write (STAGE 3: its path terms left out)
            pool_desc.store([state_row + k0, pid_v * BV], s_c)
        if STAGE == 0:
            ks += tl.sum(k_c, 1)[:, None] + tl.sum(s_c, 0)[None, :]
            qs += tl.sum(q_c, 1)[:, None]
        else:
            ks = tl.dot(k_c, s_c, ks, input_precision="tf32")
            qs = tl.dot(q_c, s_c, qs, input_precision="tf32")
    v_t = v_desc.load([b, 0, hv, pid_v * BV]).reshape(NP, BV)  # [NP, BV]
    tb = tb_desc.load([pid_bh * NP, 0]).to(tl.float32)  # [NP, NP]
    if STAGE >= 2:
        delta = tl.dot(tb, v_t - ks, input_precision="tf32")  # [NP, BV]
        qkd = qkd_desc.load([pid_bh * NP, 0]).to(tl.float32)  # [NP, NP]
        o = qs + tl.dot(qkd, delta, input_precision="tf32")  # [NP, BV]
    else:
        delta = v_t - ks + tl.sum(tb, 1)[:, None]
        qkd = qkd_desc.load([pid_bh * NP, 0]).to(tl.float32)
        o = qs + tl.sum(qkd, 1)[:, None]
    o_desc.store([b, 0, hv, pid_v * BV], o.reshape(1, NP, 1, BV))
    if STAGE != 3:  # a fold recomputes the accepted path's Delta in the next step instead of storing every node's
        delta_desc.store([b, 0, hv, pid_v * BV], delta.reshape(1, NP, 1, BV))


def _committed(x, path) -> torch.Tensor:
    """float64 ``gamma_a S + K_p^T diag(w) Delta_p`` per (request, value head): ``[B, HV, K, V]``."""
    kp, dp, w, ga = path
    rep = x["v"].shape[2] // kp.shape[2]
    s = x["pool"][x["slots"].long()].double()  # [B, HV, K, V]
    kp64 = kp.double().repeat_interleave(rep, dim=2)  # [B, P, HV, K]
    return ga.double().view(s.shape[:2])[..., None, None] * s + torch.einsum(
        "bphk,bph,bphv->bhkv", kp64, w.double(), dp.double())


def _want(stage: str, x, tb, qkd, s0: torch.Tensor):
    """float64 torch form of what ``_apply_ladder`` stores at ``stage`` from the float64 state ``s0: [B, HV, K, V]``
    (``commit``: the state the previous step's path commits): (o, delta), each ``[B, N, HV, V]``."""
    B, N, HV, V = x["v"].shape
    rep = HV // x["q"].shape[2]
    q = x["q"].double().repeat_interleave(rep, dim=2)  # [B, N, HV, K]
    k = x["k"].double().repeat_interleave(rep, dim=2)  # [B, N, HV, K]
    v = x["v"].double()
    tb64 = tb.double().view(B, HV, N, N)  # [B, HV, N, N]
    qkd64 = qkd.double().view(B, HV, N, N)
    if stage == "bytes":
        ks = k.sum(-1)[..., None] + s0.sum(2)[:, None]  # [B, N, HV, V]
        qs = q.sum(-1)[..., None].expand(-1, -1, -1, V)
    else:
        ks = torch.einsum("bnhk,bhkv->bnhv", k, s0)
        qs = torch.einsum("bnhk,bhkv->bnhv", q, s0)
    if stage in ("full", "fold", "commit"):
        delta = torch.einsum("bhij,bjhv->bihv", tb64, v - ks)
        return qs + torch.einsum("bhij,bjhv->bihv", qkd64, delta), delta
    delta = v - ks + tb64.sum(-1).transpose(1, 2)[..., None]
    return qs + qkd64.sum(-1).transpose(1, 2)[..., None], delta


def _stage(x, tb, qkd, stage: str, bv: int, bk: int, warps: int, stages: int) -> tuple[tuple, float]:
    """One stage of the ladder at one tiling: ((error of o, error of Delta; ``commit``: also of the committed
    state) against float64 on NaN-poisoned outputs, median µs of CUDA-graph replays). ``commit`` runs on a copy of
    the pool, with a random previous path (``PATH`` nodes' k and Delta, decay ratios in (0, 1])."""
    B, N, H, K = x["q"].shape
    HV, V = x["v"].shape[2:]
    gen = torch.Generator(device=x["v"].device).manual_seed(2)
    kp = torch.randn(B, PATH, H, K, device=x["v"].device, generator=gen)  # [B, P, H, K]
    kp = kp / kp.norm(dim=-1, keepdim=True)
    dp = torch.randn(B, PATH, HV, V, device=x["v"].device, generator=gen) * 0.1  # [B, P, HV, V]
    w = torch.rand(B, PATH, HV, device=x["v"].device, generator=gen)  # [B, P, HV]
    ga = torch.rand(B * HV, device=x["v"].device, generator=gen) * 0.5 + 0.5  # [B HV]
    path = (kp, dp, w, ga)
    if stage == "commit":
        x = dict(x, pool=x["pool"].clone())
    o, delta = torch.full_like(x["v"], float("nan")), torch.full_like(x["v"], float("nan"))  # [B, N, HV, V]
    node = [1, N, 1]
    descs = (_desc(x["pool"].view(-1, V), [bk, bv]), _desc(x["q"], node + [bk]), _desc(x["k"], node + [bk]),
             _desc(x["v"], node + [bv]), _desc(tb, [N, N]), _desc(qkd, [N, N]), _desc(o, node + [bv]),
             _desc(delta, node + [bv]), x["slots"], _desc(kp, [1, PATH, 1, bk]), _desc(dp, [1, PATH, 1, bv]),
             w, ga)

    def fn():
        _apply_ladder[(V // bv, B * HV)](*descs, H, HV, K, N, bk, bv, STAGES[stage], PATH,
                                         num_warps=warps, num_stages=stages)
    s0 = _committed(x, path) if stage == "commit" else x["pool"][x["slots"].long()].double()  # [B, HV, K, V]
    want_o, want_d = _want(stage, x, tb, qkd, s0)
    fn()
    torch.cuda.synchronize()
    check = (_rel(o, want_o), _rel(delta, want_d) if stage != "fold" else 0.0)  # fold stores no Delta
    if stage == "commit":
        check = (*check, _rel(x["pool"][x["slots"].long()], s0))
    return check, bench_gdn.graph_time(fn)[0]


def _sweep(x, tb, qkd, rows, checks, wide=True):
    """The loop and full stages at other (BV, BK, warps, stages): does another tiling stream the apply's bytes
    faster? ``wide=False`` (run 68): the loop, full and fold stages at the best region of run 67's sweep only."""
    for bv in (32, 64, 128):
        for bk in (32, 64) if wide else (32,):
            for warps, stages in ((4, 2), (4, 3), (4, 4), (8, 2), (8, 3)) if wide else ((4, 2), (4, 3)):
                for stage in ("loop", "full") if wide else ("loop", "full", "fold", "commit"):
                    name = f"sweep {stage} bv{bv} bk{bk} w{warps} s{stages}"
                    try:
                        checks[name], rows[name] = _stage(x, tb, qkd, stage, bv, bk, warps, stages)
                    except Exception as exc:  # noqa: BLE001 - a tiling that does not compile (shared memory)
                        print(f"{name}: {type(exc).__name__}: {str(exc)[:120]}")


def fla_allowance(x, rows: dict, checks: dict) -> tuple[float, float, int]:
    """fla-core's decode step on ``x`` (timed into ``rows``, its float64 error into ``checks``), the copy rate and
    the split apply's DRAM bytes (q / k read once), printed: (the 2x allowance in µs, NaN without fla; bytes per
    second; bytes)."""
    B, N, H, K = x["q"].shape
    HV, V = x["v"].shape[2:]
    allowance = float("nan")
    try:
        import fla.ops.gated_delta_rule as fla  # noqa: PLC0415
        ar = bench_gdn.fla_fns(x, fla)[0]
        checks["fla decode"] = (bench_gdn.fla_error(x, "ar", ar), 0.0)
        rows["fla decode step"] = bench_gdn.graph_time(ar)[0]
        allowance = 2 * rows["fla decode step"]
    except ImportError as exc:
        print(f"fla not importable ({exc}): no allowance in this run")
    copy = bench_gdn.copy_bandwidth()
    io = 4 * B * HV * K * V + 2 * 4 * B * N * H * K + 3 * 4 * B * N * HV * V + 2 * 2 * B * HV * N * N
    print(f"{torch.cuda.get_device_name()}; copy rate {copy / 1e12:.2f} TB/s; the apply's DRAM bytes (q / k once) "
          f"{io / 1e6:.0f} MB = {io / copy * 1e6:.1f} us at the copy rate")
    return allowance, copy, io


def _desc(t, block):
    return TensorDescriptor(t, list(t.shape), list(t.stride()), list(block))


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm()) if bool(torch.isfinite(got).all()) else float("inf")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="apply_probe.json")
    parser.add_argument("--sweep", action="store_true", help="time the ladder's loop and full stages at other tilings")
    parser.add_argument("--fold-sweep", action="store_true", help="loop, full and fold at run 67's best tilings")
    args = parser.parse_args()
    B, N = 64, 64
    HV, K, V = bench_gdn.HV, bench_gdn.K, bench_gdn.V
    x = bench_gdn.make_inputs(B, N, "random", 0)
    x["meta"] = bench_gdn.G.tree_meta(x["parents"])
    cfg = bench_gdn.row_config(x, "tf32")
    BV, BK, NP = cfg.block_v, cfg.block_k, N
    gen = torch.Generator(device="cuda").manual_seed(1)
    tb = (torch.randn(B * HV * NP, NP, device="cuda", generator=gen) * 0.1).half()  # [B HV NP, NP] stand-in scratch
    qkd = (torch.randn(B * HV * NP, NP, device="cuda", generator=gen) * 0.1).half()
    rows, checks = {}, {}
    pool_before = x["pool"].clone()
    for stage in STAGES:
        checks[stage], rows[f"ladder {stage}"] = _stage(x, tb, qkd, stage, BV, BK, cfg.num_warps, cfg.num_stages)
    if args.sweep or args.fold_sweep:
        _sweep(x, tb, qkd, rows, checks, wide=args.sweep)
    checks["fold keeps the state"] = (float(torch.equal(x["pool"], pool_before)), 0.0)
    verify = lambda: gdn_profile._verify(x, "tf32")  # noqa: E731
    rows["library apply alone (solve left out)"] = bench_gdn.graph_time(
        gdn_profile._without("_gdn_tree_solve_kernel", verify))[0]
    rows["library solve alone (apply left out)"] = bench_gdn.graph_time(
        gdn_profile._without("_gdn_tree_apply_kernel", verify))[0]
    rows["library verify"] = bench_gdn.graph_time(verify)[0]
    _, commit, _, _, pool = bench_gdn.ours_fns(x, "tf32")
    rows["library commit"] = bench_gdn.graph_time(commit)[0]
    scale = torch.full((HV,), 0.5, device="cuda")
    rmw = lambda: _scale_tiles[(B * HV, V // 64, 1)](pool, x["slots"], scale, HV, K, V, 128, 64,  # noqa: E731
                                                     num_warps=4)
    before = pool.clone()
    rmw()
    torch.cuda.synchronize()
    checks["rmw"] = (float(torch.equal(pool, before * 0.5)), 0.0)
    scale.fill_(1.0)
    rows["commit tiles read-modify-write"] = bench_gdn.graph_time(rmw)[0]
    allowance, copy, io = fla_allowance(x, rows, checks)
    for name, us in rows.items():
        print(f"| {name} | {us:.1f} us | {us / allowance:.2f} of the 2x allowance {allowance:.1f} us |")
    ceiling = rows["ladder loop"] + rows["commit tiles read-modify-write"]
    print(f"| ladder loop + commit RMW (a split pipeline: no solve, no epilogue, no path terms) | {ceiling:.1f} us | "
          f"{ceiling / allowance:.2f} of the allowance |")
    for name, errs in checks.items():
        print(f"check {name}: " + " ".join(f"{e:.2e}" for e in errs))
    with open(args.out, "w") as fh:
        json.dump(dict(card=torch.cuda.get_device_name(), copy_tb_s=copy / 1e12, io_bytes=io, config=cfg._asdict(),
                       us=rows, checks=checks, allowance_us=allowance), fh, indent=1)
    exact = ("rmw", "fold keeps the state")
    ok = all(max(v) < 1e-2 for n, v in checks.items() if n not in (*exact, "fla decode"))
    ok = ok and all(checks[n][0] == 1.0 for n in exact)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
