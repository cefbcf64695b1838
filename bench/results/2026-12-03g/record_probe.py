"""Thirty-second session: what the deferred commit's record step costs beside the fused verify (issue 5).

After a step's verify the sampler picks each request's accepted node ``a``; the fused design does not rewrite the
state then: the record step writes what the next verify applies to each state chunk as it streams it,
``S <- gamma_a S + (diag(w) K^_p)^T^T Delta_p`` (``gluon_probe.py``, ``FOLD == 28``: the path operand ``kpt =
(diag(w) K^_p)^T [K, P]`` per (request, value head), ``Delta_p [P, HV V]`` rows per request, ``gamma_a``), with
``K^_p`` the path's normalised keys (``k * k_rnorm``), ``w_j = Gamma_a / Gamma_j`` and ``gamma_a = Gamma_a``.

``_record_kernel`` is one program per (request, value head): the path is the set bits of ``a``'s ancestor bitset
(topological order, ``a`` last), at most ``P`` nodes; it writes the whole ``kpt`` tile (zero columns past the
path, so the verify needs no length) and the path's Delta rows (only those). ``PER_HEAD``: the layout planned for
fewer bytes: ``w`` folded into the Delta rows (``dp_j = w_j Delta_j``) and the path operand ``K^_p^T`` written
once per (request, key head), by the group's first value head. Both are checked against torch on the same
inputs, then timed (CUDA-graph medians) beside ``gluon_probe``'s ``FOLD == 28`` verify (q / k normalised in the
kernel) and fla-core's decode step (the 2x allowance) in the same run. The benchmark's trees and accepted nodes
(``bench/gdn_tree.py``: the node nearest half the tree's depth).

Run (GPU): ``PYTHONPATH=$PWD:$PWD/bench:<fla> python bench/results/2026-12-03g/record_probe.py [--out PATH]``.
"""
import argparse
import json
import math
import os
import sys

import torch
import triton
import triton.language as tl

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gluon_probe as GP  # noqa: E402

H, HV, K, V, PATH = GP.H, GP.HV, GP.K, GP.V, GP.PATH


@triton.jit
def _record_kernel(words_ptr, accepted_ptr, lg2_ptr, k_ptr, krn_ptr, delta_ptr, kpt_ptr, dp_ptr, ga_ptr, N,
                   H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, W: tl.constexpr,
                   NP: tl.constexpr, P: tl.constexpr, PER_HEAD: tl.constexpr):
    """Program ``(b, hv)``: the accepted node's path (ancestor bits of ``a``) into ``kpt`` and ``dp``, and
    ``gamma_a = 2^lg2_a``. ``lg2 [B HV, N]`` is ``log2 Gamma``; ``k [B, N, H, K]``, ``k_rnorm [B, N, H]``,
    ``delta [B, N, HV, V]``. Layouts: ``kpt [B HV K, P]`` (``PER_HEAD``: ``[B H K, P]``), ``dp [B P, HV V]``,
    ``ga [B HV]``."""
    pid = tl.program_id(0)
    b = pid // HV
    hv = pid % HV
    h = hv // (HV // H)
    a = tl.load(accepted_ptr + b)
    nodes = tl.arange(0, NP)  # [NP]
    word = tl.load(words_ptr + (b * N + a) * W + nodes // 32, mask=nodes < N, other=0)  # [NP] int32
    on = (((word >> (nodes % 32)) & 1) != 0) & (nodes < N)  # [NP] j on a's path (a included)
    place = tl.cumsum(on.to(tl.int32), axis=0) - 1  # [NP] its position on the path (topological)
    slots = tl.arange(0, P)  # [P]
    pick = on[None, :] & (place[None, :] == slots[:, None])  # [P, NP] path position -> node
    node = tl.sum(tl.where(pick, nodes[None, :], 0), axis=1)  # [P] (0 past the path)
    real = tl.sum(pick.to(tl.int32), axis=1) > 0  # [P]
    lg_a = tl.load(lg2_ptr + pid * N + a)
    lg_j = tl.load(lg2_ptr + pid * N + node, mask=real, other=0.0)  # [P]
    w = tl.where(real, tl.exp2(lg_a - lg_j), 0.0)  # [P] Gamma_a / Gamma_j
    cols_k = tl.arange(0, K)  # [K]
    cols_v = tl.arange(0, V)  # [V]
    rn = tl.load(krn_ptr + (b * N + node) * H + h, mask=real, other=0.0)  # [P]
    if PER_HEAD:
        if hv % (HV // H) == 0:  # the group's first value head writes the shared operand
            k_rows = tl.load(k_ptr + ((b * N + node[:, None]) * H + h) * K + cols_k[None, :], mask=real[:, None],
                             other=0.0)  # [P, K]
            kpt = tl.trans(k_rows * rn[:, None])  # [K, P] K^_p^T
            tl.store(kpt_ptr + ((b * H + h) * K + cols_k[:, None]) * P + slots[None, :], kpt)
        scale_rows = w  # w into the Delta rows
    else:
        k_rows = tl.load(k_ptr + ((b * N + node[:, None]) * H + h) * K + cols_k[None, :], mask=real[:, None],
                         other=0.0)  # [P, K]
        kpt = tl.trans(k_rows * (rn * w)[:, None])  # [K, P] (diag(w) K^_p)^T
        tl.store(kpt_ptr + (pid * K + cols_k[:, None]) * P + slots[None, :], kpt)
        scale_rows = tl.where(real, 1.0, 0.0)
    d_rows = tl.load(delta_ptr + ((b * N + node[:, None]) * HV + hv) * V + cols_v[None, :], mask=real[:, None],
                     other=0.0)  # [P, V]
    tl.store(dp_ptr + (b * P + slots[:, None]) * (HV * V) + hv * V + cols_v[None, :], d_rows * scale_rows[:, None],
             mask=real[:, None])
    tl.store(ga_ptr + pid, tl.exp2(lg_a))


def record_inputs(x):
    """The record step's inputs on the benchmark's trees: ``lg2 [B HV, N]`` from g through the ancestor masks,
    ``k_rnorm [B, N, H]``, a Delta ``[B, N, HV, V]`` (random), and the path lengths."""
    B, N = x["parents"].shape
    words = x["meta"].words  # [B, N, W]
    bits = torch.arange(N, device=words.device)
    anc = ((words[:, :, bits // 32] >> (bits % 32)) & 1).bool()  # [B, N, N] j ancestor-or-self of i
    log_gamma = torch.einsum("bij,bjh->bih", anc.double(), x["g"].double())  # [B, N, HV]
    lg2 = (log_gamma / math.log(2.0)).float().permute(0, 2, 1).reshape(B * HV, N).contiguous()  # [B HV, N]
    k_rnorm = torch.rsqrt((x["k"] * x["k"]).sum(-1) + 1e-6)  # [B, N, H]
    gen = torch.Generator(device=words.device).manual_seed(3)
    delta = torch.randn(B, N, HV, V, device=words.device, generator=gen)  # [B, N, HV, V]
    path_len = anc[torch.arange(B), x["accepted"].long()].sum(-1)  # [B]
    return anc, lg2, k_rnorm, delta, path_len


def record_want(x, anc, lg2, k_rnorm, delta, per_head: bool):
    """torch: ``kpt``, the Delta rows of the path (zero past it) and ``gamma_a``, in the kernel's layouts."""
    B, N = x["parents"].shape
    kpt = torch.zeros(B, H if per_head else HV, K, PATH, device=delta.device)
    dp = torch.zeros(B, PATH, HV, V, device=delta.device)
    lg = lg2.view(B, HV, N)
    for b in range(B):
        a = int(x["accepted"][b])
        nodes = anc[b, a].nonzero().flatten()  # ascending = topological
        for j, n in enumerate(nodes.tolist()):
            w = torch.exp2(lg[b, :, a] - lg[b, :, n])  # [HV]
            kn = x["k"][b, n] * k_rnorm[b, n][:, None]  # [H, K]
            if per_head:
                kpt[b, :, :, j] = kn
                dp[b, j] = delta[b, n] * w[:, None]
            else:
                kpt[b, :, :, j] = kn.repeat_interleave(HV // H, dim=0) * w[:, None]
                dp[b, j] = delta[b, n]
    return kpt, dp, torch.exp2(lg[torch.arange(B), :, x["accepted"].long()]).reshape(B * HV)


def record_launch(x, lg2, k_rnorm, delta, kpt, dp, ga, per_head: bool):
    B, N = x["parents"].shape
    words = x["meta"].words
    return lambda: _record_kernel[(B * HV, )](words, x["accepted"], lg2, x["k"], k_rnorm, delta, kpt, dp, ga, N,
                                              H=H, HV=HV, K=K, V=V, W=words.shape[2], NP=triton.next_power_of_2(N),
                                              P=PATH, PER_HEAD=per_head, num_warps=4)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="record_probe.json")
    args = parser.parse_args()
    import apply_probe as ladder  # noqa: PLC0415
    import gdn_tree as bench_gdn  # noqa: PLC0415
    B, N = 64, 64
    x = bench_gdn.make_inputs(B, N, "random", 0)
    x["meta"] = bench_gdn.G.tree_meta(x["parents"])
    anc, lg2, k_rnorm, delta, path_len = record_inputs(x)
    print(f"accepted path lengths: mean {float(path_len.float().mean()):.2f}, max {int(path_len.max())}", flush=True)
    assert int(path_len.max()) <= PATH
    rows, checks = {}, {}
    for per_head in (False, True):
        name = "record, w in the path operand" if not per_head else "record, w in the Delta rows (per key head)"
        kpt = torch.full((B * (H if per_head else HV) * K, PATH), float("nan"), device="cuda")
        dp = torch.zeros(B * PATH, HV * V, device="cuda")  # (only the path's rows are written: zeros past it)
        ga = torch.full((B * HV, ), float("nan"), device="cuda")
        fn = record_launch(x, lg2, k_rnorm, delta, kpt, dp, ga, per_head)
        fn()
        torch.cuda.synchronize()
        want = record_want(x, anc, lg2, k_rnorm, delta, per_head)
        got = (kpt.view(want[0].shape), dp.view(want[1].shape), ga)
        checks[name] = tuple(ladder._rel(g_, w_.double()) for g_, w_ in zip(got, want))
        rows[name] = bench_gdn.graph_time(fn)[0]
        written = kpt.numel() * 4 + int(path_len.sum()) * HV * V * 4 + ga.numel() * 4
        read = int(path_len.sum()) * (H * K + HV * V) * 4
        print(f"{name}: {rows[name]:.1f} us, writes {written / 1e6:.1f} MB, reads {read / 1e6:.1f} MB", flush=True)
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    gen = torch.Generator(device="cuda").manual_seed(1)
    tb = (torch.randn(B * HV * N, N, device="cuda", generator=gen) * 0.1).half()  # (unused by FOLD 28)
    qkd = (torch.randn(B * HV * N, N, device="cuda", generator=gen) * 0.1).half()
    variant = (16, 3, 28, 8, 192, 4)
    name = "fused verify (gluon_probe FOLD 28, norms in the kernel)"
    checks[name], rows[name], _ = GP.check(x, tb, qkd, GP.make_path(x), variant, nsm, ladder,
                                           lambda fn: bench_gdn.graph_time(fn)[0])
    allowance, copy, _ = ladder.fla_allowance(x, rows, checks)
    for rec in [n for n in rows if n.startswith("record")]:
        rows[f"verify + {rec}"] = rows[name] + rows[rec]
    for n, us in rows.items():
        print(f"| {n} | {us:.1f} us | {us / allowance:.3f} of the 2x allowance {allowance:.1f} us |")
    for n, errs in checks.items():
        print(f"check {n}: " + " ".join(f"{e:.2e}" for e in errs))
    with open(args.out, "w") as fh:
        json.dump(dict(card=torch.cuda.get_device_name(), copy_tb_s=copy / 1e12, us=rows, checks=checks,
                       allowance_us=allowance, mean_path=float(path_len.float().mean())), fh, indent=1)
    return 0 if all(max(e) < 1e-2 for n, e in checks.items() if n != "fla decode") else 1


if __name__ == "__main__":
    sys.exit(main())
