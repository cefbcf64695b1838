r"""Single-token Gated DeltaNet decode: the short-conv step and the fused recurrent step, in place in the pools.

A decode step advances every request by one token; there is no tree, so the state is read once and written once
(a tree verify followed by the commit of its root would read it twice). Two kernels per GDN layer:

:func:`conv_step` (one program per (request, channel block)): the depthwise causal conv of the new input ``x`` over
the committed conv state (oldest row first, as :func:`lumotree.reference.gdn.short_conv` on a one-node tree), with
SiLU, and the conv state shifted by one row in place (:func:`lumotree.reference.gdn.conv_state_commit` of that node)::

    y[c] = act(sum_{t < W-1} weight[c, t] state[t, c] + weight[c, W-1] x[c]),    state <- (state[1:], x)

:func:`gdn_decode` (one program per (request, value head, V block)): gates, L2 norms and the delta rule with the state
tile ``S [K, BV]`` read once from the pool by slot and written back in place::

    g = -exp(A_log) softplus(a + dt_bias),  alpha = exp(g),  beta = sigmoid(b)  (2 sigmoid(b): allow_neg_eigval)
    q = scale l2norm(q),  k = l2norm(k)       (value head hv reads q/k head hv // (HV // H))
    delta = beta (v - alpha S^T k)                                   [BV]
    S'    = alpha S + k delta^T                                      (= alpha (I - beta k k^T) S + beta k v^T)
    o     = S'^T q = alpha S^T q + (q . k) delta

and, when ``z`` and ``norm_weight`` are given (one V block covering the head), the gated RMSNorm of the layer output,
``w * o * rsqrt(mean(o^2) + eps) * silu(z)`` (:func:`lumotree.reference.gdn.gated_rmsnorm`), so the kernel writes the
input of ``out_proj`` directly. :func:`gated_rmsnorm` is the same normalisation as a kernel of its own (tree verify).

Layouts as flash-linear-attention without the time axis: ``q, k: [B, H, K]``, ``v, z: [B, HV, V]``,
``a, b: [B, HV]`` (strided views of one projection are fine), fp32 state pool ``[P, HV, K, V]``, conv-state pool
``[P, W - 1, C]`` addressed by ``slots: [B]`` (distinct: the kernels write them).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .checks import FLOAT_DTYPES, check_finite_nodes, check_scalar, check_slots, check_tensor, interpreting, num_sms
from .gdn_tree.primitives import log_decay
from .gemv import split_k_scratch
from .pdl import allow_dependents, pdl_supported

__all__ = ["conv_step", "gdn_decode", "gated_rmsnorm", "ACTIVATIONS"]

ACTIVATIONS = ("silu", None)  # the activations of lumotree.optimized.ops.conv_tree.tree_conv


# ----------------------------------------------------------------------------------------------------------- kernels
@triton.jit
def _conv_step_kernel(
    x_ptr, weight_ptr, conv_pool_ptr, slots_ptr, out_ptr,
    C, s_xb, s_ob,
    WIDTH: tl.constexpr, RP: tl.constexpr, BC: tl.constexpr, SILU: tl.constexpr,
):  # fmt: skip
    """One program per (request, channel block): conv over (state rows, x), then the state shifted by one row."""
    b = tl.program_id(0)
    chans = tl.program_id(1) * BC + tl.arange(0, BC)  # [BC]
    chan_ok = chans < C
    slot = tl.load(slots_ptr + b).to(tl.int64)
    state = conv_pool_ptr + slot * ((WIDTH - 1) * C)
    rows = tl.arange(0, RP)  # [RP] state rows, oldest first
    row_ok = rows < WIDTH - 1
    tile_ok = row_ok[:, None] & chan_ok[None, :]  # [RP, BC]
    x = tl.load(x_ptr + b * s_xb + chans, mask=chan_ok, other=0.0).to(tl.float32)  # [BC]
    old = tl.load(state + rows[:, None] * C + chans[None, :], mask=tile_ok, other=0.0).to(tl.float32)  # [RP, BC]
    # new row r = old row r + 1 (the last row: x); every load is issued before any store (in place)
    nxt = tl.load(state + (rows + 1)[:, None] * C + chans[None, :],
                  mask=(rows + 1 < WIDTH - 1)[:, None] & chan_ok[None, :], other=0.0)  # [RP, BC]
    w_old = tl.load(weight_ptr + chans[None, :] * WIDTH + rows[:, None], mask=tile_ok, other=0.0).to(tl.float32)
    w_new = tl.load(weight_ptr + chans * WIDTH + (WIDTH - 1), mask=chan_ok, other=0.0).to(tl.float32)  # [BC]
    y = tl.sum(old * w_old, axis=0) + w_new * x  # [BC]
    if SILU:
        y = y * tl.sigmoid(y)
    new = tl.where((rows == WIDTH - 2)[:, None], x[None, :], nxt.to(tl.float32))  # [RP, BC]
    tl.debug_barrier()
    tl.store(state + rows[:, None] * C + chans[None, :], new.to(conv_pool_ptr.dtype.element_ty), mask=tile_ok)
    tl.store(out_ptr + b * s_ob + chans, y.to(out_ptr.dtype.element_ty), mask=chan_ok)


@triton.jit
def _gated_norm(o, z, w, eps, V: tl.constexpr):
    """``w * o * rsqrt(mean(o^2) + eps) * silu(z)`` over one head (``o, z, w: [BV]`` fp32, masked lanes zero)."""
    rstd = 1.0 / tl.sqrt(tl.sum(o * o, axis=0) / V + eps)
    return w * (o * rstd) * (z * tl.sigmoid(z))


@triton.jit
def _gdn_decode_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, a_log_ptr, dt_bias_ptr, pool_ptr, slots_ptr, z_ptr, norm_w_ptr, out_ptr,
    o_part_ptr, count_ptr, scale, eps,
    s_qb, s_qh, s_kb, s_kh, s_vb, s_vh, s_ab, s_bb, s_zb, s_zh, s_ob, s_oh,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
    L2NORM: tl.constexpr, BETA_TWO: tl.constexpr, GATED_NORM: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """One program per (request, value head, V block): one read and one write of the state tile ``[K, BV]``.
    ``GATED_NORM`` with ``BV < V``: the norm needs the whole head, so each program stores its fp32 ``o`` block to
    ``o_part [B, HV, V]`` and counts itself in ``count[b, hv]`` (acq_rel); the head's last program reads the whole
    head back (L2), normalises and writes it, and resets the counter (a CUDA graph replays it unchanged)."""
    allow_dependents(PDL)  # the output projection's GEMV may launch now (ops.pdl)
    pid_bh = tl.program_id(0)
    pid_v = tl.program_id(1)
    b = pid_bh // HV
    hv = pid_bh % HV
    h = hv // (HV // H)
    slot = tl.load(slots_ptr + b).to(tl.int64)
    kk = tl.arange(0, K)  # [K]
    vcols = pid_v * BV + tl.arange(0, BV)  # [BV]
    tile = pool_ptr + ((slot * HV + hv) * K + kk[:, None]) * V + vcols[None, :]  # [K, BV]
    s = tl.load(tile)  # [K, BV] fp32, issued first: the longest load
    q = tl.load(q_ptr + b * s_qb + h * s_qh + kk).to(tl.float32)  # [K]
    k = tl.load(k_ptr + b * s_kb + h * s_kh + kk).to(tl.float32)  # [K]
    v = tl.load(v_ptr + b * s_vb + hv * s_vh + vcols).to(tl.float32)  # [BV]
    if L2NORM:
        q = q / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6)
        k = k / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6)
    q = q * scale
    x = tl.load(a_ptr + b * s_ab + hv).to(tl.float32) + tl.load(dt_bias_ptr + hv).to(tl.float32)
    alpha = tl.exp(log_decay(x, tl.load(a_log_ptr + hv).to(tl.float32)))
    beta = tl.sigmoid(tl.load(b_ptr + b * s_bb + hv).to(tl.float32))
    if BETA_TWO:
        beta = 2.0 * beta
    k_s = tl.sum(k[:, None] * s, axis=0)  # [BV] S^T k
    q_s = tl.sum(q[:, None] * s, axis=0)  # [BV] S^T q
    delta = beta * (v - alpha * k_s)  # [BV]
    tl.store(tile, alpha * s + k[:, None] * delta[None, :])
    o = alpha * q_s + tl.sum(q * k, axis=0) * delta  # [BV]
    if GATED_NORM and BV == V:  # this program holds the whole head
        z = tl.load(z_ptr + b * s_zb + hv * s_zh + vcols).to(tl.float32)
        o = _gated_norm(o, z, tl.load(norm_w_ptr + vcols).to(tl.float32), eps, V)
        tl.store(out_ptr + b * s_ob + hv * s_oh + vcols, o.to(out_ptr.dtype.element_ty))
    elif GATED_NORM:  # V / BV programs per head: the last one to arrive normalises the head
        head = pid_bh.to(tl.int64) * V
        tl.store(o_part_ptr + head + vcols, o)
        tl.debug_barrier()  # every thread's block is stored before the (one-thread) release below
        arrived = tl.atomic_add(count_ptr + pid_bh, 1, sem="acq_rel", scope="gpu")
        if arrived == V // BV - 1:
            cols = tl.arange(0, V)  # [V]
            o_head = tl.load(o_part_ptr + head + cols, cache_modifier=".cg")  # [V] fp32
            z = tl.load(z_ptr + b * s_zb + hv * s_zh + cols).to(tl.float32)
            o_head = _gated_norm(o_head, z, tl.load(norm_w_ptr + cols).to(tl.float32), eps, V)
            tl.store(out_ptr + b * s_ob + hv * s_oh + cols, o_head.to(out_ptr.dtype.element_ty))
            tl.atomic_xchg(count_ptr + pid_bh, 0, sem="relaxed", scope="gpu")
    else:
        tl.store(out_ptr + b * s_ob + hv * s_oh + vcols, o.to(out_ptr.dtype.element_ty))


@triton.jit
def _gated_rmsnorm_kernel(
    o_ptr, z_ptr, w_ptr, out_ptr, R, eps,
    s_ot, s_oh, s_zt, s_zh, s_outt, s_outh,
    HV: tl.constexpr, V: tl.constexpr, BR: tl.constexpr,
):  # fmt: skip
    """``BR`` rows (token, value head) per program: the gated RMSNorm of each ``V``-long row."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)  # [BR]
    ok = rows < R
    t = (rows // HV).to(tl.int64)
    hv = rows % HV
    cols = tl.arange(0, V)  # [V]
    m = ok[:, None]
    o = tl.load(o_ptr + (t * s_ot + hv * s_oh)[:, None] + cols[None, :], mask=m, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + (t * s_zt + hv * s_zh)[:, None] + cols[None, :], mask=m, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols).to(tl.float32)  # [V]
    rstd = 1.0 / tl.sqrt(tl.sum(o * o, axis=1) / V + eps)  # [BR]
    y = w[None, :] * (o * rstd[:, None]) * (z * tl.sigmoid(z))
    tl.store(out_ptr + (t * s_outt + hv * s_outh)[:, None] + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=m)


# ---------------------------------------------------------------------------------------------------------- wrappers
def _pow2(name: str, value: int) -> None:
    if value < 16 or value > 256 or value & (value - 1):
        raise ValueError(f"{name} = {value}: the kernels need a power of two in [16, 256]")


def conv_step(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_pool: torch.Tensor,
    slots: torch.Tensor,
    *,
    activation: str | None = "silu",
    out: torch.Tensor | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """One token of the short convolution per request, conv state advanced in place; returns ``y [B, C]``.

    ``x: [B, C]`` (a strided row view is fine), ``weight: [C, W]``, ``conv_pool: [P, W - 1, C]`` read and written at
    ``slots: [B]`` (distinct). ``y`` has x's dtype; ``activation``: ``"silu"`` or None.
    """
    device = x.device if isinstance(x, torch.Tensor) else torch.device("cpu")
    check_tensor("x", x, (None, None), "B, C", FLOAT_DTYPES, device)
    B, C = x.shape
    check_tensor("conv_pool", conv_pool, (None, None, C), "P, W - 1, C", FLOAT_DTYPES, device, contiguous=True)
    width = conv_pool.shape[1] + 1
    if width < 2:
        raise ValueError("conv_pool has W - 1 = 0 rows: a width-1 convolution keeps no state")
    check_tensor("weight", weight, (C, width), "C, W", FLOAT_DTYPES, device, contiguous=True)
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation = {activation!r}, expected one of {ACTIVATIONS}")
    slots = check_slots(slots, B, conv_pool.shape[0], device, validate, distinct=True)
    if out is not None:
        check_tensor("out", out, (B, C), "B, C", (x.dtype,), device)
    if validate:
        check_finite_nodes("x", x[:, None], None)
        check_finite_nodes("weight", weight[None], None)
    out = torch.empty((B, C), dtype=x.dtype, device=device) if out is None else out  # [B, C]
    BC = min(256, triton.next_power_of_2(C))  # 32 programs per request at Qwen3-Next's C = 8192
    _conv_step_kernel[(B, triton.cdiv(C, BC))](
        x, weight, conv_pool, slots, out, C, x.stride(0), out.stride(0),
        WIDTH=width, RP=max(2, triton.next_power_of_2(width - 1)), BC=BC, SILU=activation == "silu",
        **({} if interpreting() else {"num_warps": 2}),
    )  # fmt: skip
    return out


def gdn_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state_pool: torch.Tensor,
    slots: torch.Tensor,
    *,
    allow_neg_eigval: bool = False,
    use_qk_l2norm_in_kernel: bool = True,
    scale: float | None = None,
    z: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    block_v: int | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """One gated delta-rule step per request from raw gates, the state updated in place (module docstring).

    ``q, k: [B, H, K]``, ``v: [B, HV, V]``, ``a, b: [B, HV]`` (last dims contiguous, other strides free);
    ``A_log, dt_bias: [HV]``; ``state_pool: [P, HV, K, V]`` fp32 at ``slots: [B]`` (distinct). Returns
    ``o = scale S'^T q: [B, HV, V]`` in v's dtype, or, with ``z: [B, HV, V]`` and ``norm_weight: [V]``, the gated
    RMSNorm of it in z's dtype. ``scale`` defaults to ``K ** -0.5``; ``block_v``: V columns per program (default:
    the whole head when the batch alone fills the GPU, else 32; with the norm and ``block_v < V`` the head's last
    program normalises it, see the kernel: at B = 1 one program per head left 100 of the H200's 132 SMs idle).
    """
    device = q.device if isinstance(q, torch.Tensor) else torch.device("cpu")
    check_tensor("q", q, (None, None, None), "B, H, K", FLOAT_DTYPES, device)
    B, H, K = q.shape
    check_tensor("k", k, (B, H, K), "B, H, K", FLOAT_DTYPES, device)
    check_tensor("state_pool", state_pool, (None, None, K, None), "P, HV, K, V", (torch.float32,), device,
                 contiguous=True)
    P, HV, _, V = state_pool.shape
    if HV % H != 0:
        raise ValueError(f"state_pool has HV = {HV} value heads, not a multiple of q/k's H = {H} heads (GVA)")
    _pow2("K", K)
    _pow2("V", V)
    check_tensor("v", v, (B, HV, V), "B, HV, V", FLOAT_DTYPES, device)
    check_tensor("a", a, (B, HV), "B, HV", FLOAT_DTYPES, device)
    check_tensor("b", b, (B, HV), "B, HV", FLOAT_DTYPES, device)
    check_tensor("A_log", A_log, (HV,), "HV", FLOAT_DTYPES, device, contiguous=True)
    check_tensor("dt_bias", dt_bias, (HV,), "HV", FLOAT_DTYPES, device, contiguous=True)
    slots = check_slots(slots, B, P, device, validate, distinct=True)
    scale = K**-0.5 if scale is None else check_scalar("scale", scale)
    eps = check_scalar("eps", eps)
    gated = z is not None or norm_weight is not None
    if gated:
        if z is None or norm_weight is None:
            raise ValueError("the fused gated RMSNorm needs both z and norm_weight")
        check_tensor("z", z, (B, HV, V), "B, HV, V", FLOAT_DTYPES, device)
        check_tensor("norm_weight", norm_weight, (V,), "V", FLOAT_DTYPES, device, contiguous=True)
    out_dtype = z.dtype if gated else v.dtype
    if out is not None:
        check_tensor("out", out, (B, HV, V), "B, HV, V", (out_dtype,), device)
    if block_v is None:
        block_v = V if B * HV >= 2 * num_sms(device) else min(V, 32)
    if block_v not in (16, 32, 64, 128, 256) or V % block_v:
        raise ValueError(f"block_v = {block_v} must be a power of two in [16, 256] dividing V = {V}")
    if validate:
        for name, t in (("q", q), ("k", k), ("v", v), ("a", a), ("b", b), ("A_log", A_log), ("dt_bias", dt_bias)):
            check_finite_nodes(name, t.reshape(1, 1, -1) if t.ndim == 1 else t[:, None], None)
        if gated:
            check_finite_nodes("z", z[:, None], None)
            check_finite_nodes("norm_weight", norm_weight.reshape(1, 1, -1), None)
    out = torch.empty((B, HV, V), dtype=out_dtype, device=device) if out is None else out  # [B, HV, V]
    zz = z if gated else v
    if gated and block_v < V:  # the head's o blocks and arrival counters (cached: no allocation in a graph capture)
        o_part, counts = split_k_scratch(device, 1, B * HV * V, V, 1)  # [1, 1, B HV V] fp32, [B HV] int32
    else:
        o_part, counts = out, out  # unused
    _gdn_decode_kernel[(B * HV, V // block_v)](
        q, k, v, a, b, A_log, dt_bias, state_pool, slots, zz, norm_weight if gated else A_log, out, o_part, counts,
        float(scale), float(eps),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), a.stride(0), b.stride(0),
        zz.stride(0), zz.stride(1), out.stride(0), out.stride(1),
        H=H, HV=HV, K=K, V=V, BV=block_v, L2NORM=bool(use_qk_l2norm_in_kernel), BETA_TWO=bool(allow_neg_eigval),
        GATED_NORM=gated, PDL=pdl_supported(device),
        **({} if interpreting() else {"num_warps": 8 if K * block_v >= 8192 else 4}),
    )  # fmt: skip
    return out


def gated_rmsnorm(o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, *, eps: float = 1e-6,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """``weight * o * rsqrt(mean(o^2) + eps) * silu(z)`` over the last axis of ``o, z: [T, HV, V]`` (strided views
    with contiguous rows are fine); returns ``[T, HV, V]`` in z's dtype (or ``out``)."""
    device = o.device if isinstance(o, torch.Tensor) else torch.device("cpu")
    check_tensor("o", o, (None, None, None), "T, HV, V", FLOAT_DTYPES, device)
    T, HV, V = o.shape
    check_tensor("z", z, (T, HV, V), "T, HV, V", FLOAT_DTYPES, device)
    check_tensor("weight", weight, (V,), "V", FLOAT_DTYPES, device, contiguous=True)
    eps = check_scalar("eps", eps)
    if V & (V - 1):
        raise ValueError(f"V = {V} must be a power of two")
    if out is None:
        out = torch.empty((T, HV, V), dtype=z.dtype, device=device)  # [T, HV, V]
    check_tensor("out", out, (T, HV, V), "T, HV, V", FLOAT_DTYPES, device)
    R = T * HV
    BR = max(1, min(16, 4096 // V))
    _gated_rmsnorm_kernel[(triton.cdiv(R, BR),)](
        o, z, weight, out, R, float(eps), o.stride(0), o.stride(1), z.stride(0), z.stride(1), out.stride(0),
        out.stride(1), HV=HV, V=V, BR=BR, **({} if interpreting() else {"num_warps": 4}),
    )  # fmt: skip
    return out
