"""The attention layer's inputs of a tree step in one launch: q / k zero-centred RMSNorm, RoPE at each node's
position (``cache_lens[b] + offsets[b, n]``), q out, k / v written into the KV cache pool right after the committed
positions (node ``n`` at ``cache_lens[b] + n``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..checks import check_cache_slots, check_kv_cache, check_lens_fit, check_rank, check_request_rows
from ..pdl import allow_dependents, pdl_supported

__all__ = ["rope_inv_freq", "prepare_qkv"]


def rope_inv_freq(rotary_dim: int, theta: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """RoPE inverse frequencies ``theta ** (-2i / rotary_dim)``, ``i < rotary_dim / 2``, as float32 ``[rotary_dim/2]``
    (computed as transformers does, so positions rotate identically)."""
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim = {rotary_dim} must be a positive even number")
    exponent = torch.arange(0, rotary_dim, 2, dtype=torch.int64).to(torch.float32) / rotary_dim  # [R/2]
    return (1.0 / (theta**exponent)).to(device)


@triton.jit
def _prepare_qkv_kernel(
    Q, K, V, QW, KW, InvFreq, Pos, Slots, Lens, QOut, KC, VC,
    sqb, sqn, sqh, skb, skn, skh, svb, svn, svh,
    sob, son, soh, skcp, skch, skcc, svcp, svch, svcc,
    N, HQ, HKV, D, eps,
    ROT_HALF: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """One program per (request, node, head among HQ + HKV): zero-centred RMSNorm, partial RoPE, store.

    Heads ``h < HQ`` are query heads (written to QOut); heads ``HQ <= h < HQ + HKV`` are key heads, written with the
    matching value head into the cache slot at position ``L_b + node``.
    """
    allow_dependents(PDL)  # a PDL-launched tree attention may launch now and prefetch the committed K / V
    b = tl.program_id(0).to(tl.int64)  # batch offsets (b * sqb) may pass 2^31
    n = tl.program_id(1)
    h = tl.program_id(2)
    offs_d = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    mask_d = offs_d < D
    pos = (tl.load(Lens + b) + tl.load(Pos + b * N + n)).to(tl.float32)
    # rotation partner of dim d < 2*ROT_HALF: d + ROT_HALF (first half, sign -) or d - ROT_HALF (second half, sign +)
    in_rot = offs_d < 2 * ROT_HALF
    first_half = offs_d < ROT_HALF
    partner = tl.where(first_half, offs_d + ROT_HALF, offs_d - ROT_HALF)
    freq_idx = tl.where(first_half, offs_d, offs_d - ROT_HALF)
    inv_freq = tl.load(InvFreq + freq_idx, mask=in_rot, other=0.0)  # [BLOCK_D]
    angle = pos * inv_freq
    cos = tl.where(in_rot, tl.cos(angle), 1.0)
    sin = tl.where(in_rot, tl.where(first_half, -tl.sin(angle), tl.sin(angle)), 0.0)
    if h < HQ:
        base = Q + b * sqb + n * sqn + h * sqh
        w_ptr = QW
    else:
        base = K + b * skb + n * skn + (h - HQ) * skh
        w_ptr = KW
    x = tl.load(base + offs_d, mask=mask_d, other=0.0).to(tl.float32)  # [BLOCK_D]
    x_partner = tl.load(base + partner, mask=mask_d & in_rot, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    w_partner = tl.load(w_ptr + partner, mask=mask_d & in_rot, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    y = x * rstd * (1.0 + w)
    y_partner = x_partner * rstd * (1.0 + w_partner)
    out = y * cos + y_partner * sin
    if h < HQ:
        tl.store(QOut + b * sob + n * son + h * soh + offs_d, out.to(QOut.dtype.element_ty), mask=mask_d)
    else:
        hk = h - HQ
        slot = tl.load(Slots + b).to(tl.int64)
        c = (tl.load(Lens + b) + n).to(tl.int64)
        tl.store(KC + slot * skcp + hk * skch + c * skcc + offs_d, out.to(KC.dtype.element_ty), mask=mask_d)
        vv = tl.load(V + b * svb + n * svn + hk * svh + offs_d, mask=mask_d, other=0.0)
        tl.store(VC + slot * svcp + hk * svch + c * svcc + offs_d, vv.to(VC.dtype.element_ty), mask=mask_d)


def prepare_qkv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_norm_weight: torch.Tensor,
    k_norm_weight: torch.Tensor,
    inv_freq: torch.Tensor,
    offsets: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    cache_lens: torch.Tensor,
    *,
    eps: float = 1e-6,
    out: torch.Tensor | None = None,
    validate: bool = True,
) -> torch.Tensor:
    """Fused pre-kernel of the attention layer: ``x_hat * (1 + w)`` RMSNorm on q and k heads, RoPE on the first
    ``2 * len(inv_freq)`` dims at position ``cache_lens[b] + offsets[b, n]`` (rotate-half convention), then

    - rotated queries -> returned ``[B, N, HQ, D]`` (or ``out``),
    - rotated keys and the values -> cache slot ``slots[b]`` at position ``cache_lens[b] + n``.

    ``q: [B, N, HQ, D]``, ``k, v: [B, N, HKV, D]`` (strided views allowed, last dim contiguous), ``offsets: [B, N]``
    int32: ``depth`` for a tree, ``n`` for a chunk of consecutive tokens.
    """
    device = q.device
    float_types = (torch.float32, torch.bfloat16, torch.float16)
    check_rank("q", q, 4, float_types, device)
    B, N, HQ, D = q.shape
    check_rank("k", k, 4, float_types, device)
    check_rank("v", v, 4, float_types, device)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.shape[:2] != (B, N) or k.shape[3] != D or v.shape != k.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must both be [B, N, HKV, D] = [{B}, {N}, *, {D}]")
    HKV = k.shape[2]
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dimension")
    check_rank("q_norm_weight", q_norm_weight, 1, float_types, device)
    check_rank("k_norm_weight", k_norm_weight, 1, float_types, device)
    if q_norm_weight.shape[0] != D or k_norm_weight.shape[0] != D:
        raise ValueError(f"q_norm_weight and k_norm_weight must have shape [D] = [{D}]")
    check_rank("inv_freq", inv_freq, 1, (torch.float32,), device)
    if 2 * inv_freq.shape[0] > D:
        raise ValueError(f"inv_freq has {inv_freq.shape[0]} entries: rotary dim {2 * inv_freq.shape[0]} > D = {D}")
    check_rank("offsets", offsets, 2, (torch.int32,), device)
    if offsets.shape != (B, N):
        raise ValueError(f"offsets has shape {tuple(offsets.shape)}, expected [B, N] = [{B}, {N}]")
    check_kv_cache(k_cache, v_cache, HKV, D, device)
    check_cache_slots(slots, cache_lens, B, device)
    if validate:
        check_lens_fit(cache_lens, offsets, N, k_cache.shape[2])
    if out is None:
        out = torch.empty((B, N, HQ, D), dtype=q.dtype, device=device)  # [B, N, HQ, D]
    elif out.shape != (B, N, HQ, D) or out.stride(-1) != 1:
        raise ValueError(f"out must be [B, N, HQ, D] = {(B, N, HQ, D)} with a contiguous last dim")
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
        check_request_rows(name, t)
    qw = q_norm_weight.to(torch.float32).contiguous()  # [D]
    kw = k_norm_weight.to(torch.float32).contiguous()  # [D]
    _prepare_qkv_kernel[(B, N, HQ + HKV)](
        q, k, v, qw, kw, inv_freq.contiguous(), offsets.contiguous(), slots, cache_lens, out, k_cache, v_cache,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1),
        v.stride(2), out.stride(0), out.stride(1), out.stride(2), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        N, HQ, HKV, D, float(eps),
        ROT_HALF=inv_freq.shape[0], BLOCK_D=triton.next_power_of_2(D), PDL=pdl_supported(device),
    )  # fmt: skip
    return out
