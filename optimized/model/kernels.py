"""The model's own small kernels: the fused residual add + RMSNorm, SwiGLU of interleaved gate / up columns, and a
step's prologue (embedding gather, slots and lengths, the tree metadata) in one launch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..ops.checks import interpreting
from ..ops.pdl import allow_dependents, pdl_supported
from ..ops.tree_meta import TreeMeta, tree_metadata_buffers, tree_metadata_program

__all__ = ["add_rmsnorm", "silu_mul", "step_prologue", "launch_opts"]


@triton.jit
def _add_rmsnorm_kernel(h_ptr, delta_ptr, w_ptr, out_ptr, D, eps, HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr,
                        PDL: tl.constexpr):
    """One program per token row: ``h += delta`` (rounded to h's dtype, in place), ``out = h rsqrt(mean h^2 + eps)
    w``."""
    allow_dependents(PDL)  # the GEMV after it may launch now (ops.pdl)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)  # [BLOCK]
    ok = cols < D
    h = tl.load(h_ptr + row * D + cols, mask=ok, other=0.0)  # [BLOCK]
    if HAS_DELTA:
        h = (h.to(tl.float32) + tl.load(delta_ptr + row * D + cols, mask=ok, other=0.0).to(tl.float32))
        h = h.to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + row * D + cols, h, mask=ok)
    hf = h.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(hf * hf, axis=0) / D + eps)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0)
    tl.store(out_ptr + row * D + cols, (hf * rstd * w).to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, inner, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """``out[t, j] = silu(gu[t, 2j]) * gu[t, 2j + 1]`` (SwiGLU of interleaved gate / up columns), fp32 arithmetic,
    one rounding."""
    allow_dependents(PDL)  # the GEMV after it may launch now (ops.pdl)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK]
    ok = cols < inner
    g = tl.load(gu_ptr + row * 2 * inner + 2 * cols, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * inner + 2 * cols + 1, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * inner + cols, (g * tl.sigmoid(g) * u).to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _step_prologue_kernel(tokens_ptr, slots_ptr, s_tok_b, s_tok_n, s_slot, embed_ptr, lens_ptr, h_ptr,
                          slots_out_ptr, lens_out_ptr, N, D, parents_ptr, num_nodes_ptr, words_ptr, depth_ptr,
                          s_par_b, s_par_n, W, BLOCK: tl.constexpr, ADVANCE: tl.constexpr, TREE: tl.constexpr,
                          NP: tl.constexpr, BLOCK_W: tl.constexpr, ROUNDS: tl.constexpr, PDL: tl.constexpr):
    """Program ``(b, n)``, ``n < N``, of a step with ``N`` tokens per request: ``h[b N + n] = embed[tokens[b, n]]``;
    program ``(b, 0)`` also stores ``slots_out[b] = slots[b]`` (int32, contiguous) and ``lens_out[b] =
    lens[slots[b]]`` (the committed length the step's attention reads) and (``ADVANCE``, a decode step: one token,
    distinct slots) then ``lens[slots[b]] += 1``, in place of the small torch ops of a gather, a cast and an index.
    With ``TREE`` (a tree step) program ``(b, N)`` builds request ``b``'s tree metadata
    (:func:`~lumotree.optimized.ops.tree_meta.tree_metadata_program`) next to the others."""
    allow_dependents(PDL)  # the first GEMV may launch now (ops.pdl)
    b = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1)
    if TREE and n == N:
        tree_metadata_program(b, parents_ptr, num_nodes_ptr, words_ptr, depth_ptr, N, s_par_b, s_par_n, W, NP,
                              BLOCK_W, ROUNDS, True)
    else:
        tok = tl.load(tokens_ptr + b * s_tok_b + n * s_tok_n).to(tl.int64)
        cols = tl.arange(0, BLOCK)  # [BLOCK]
        row = b * N + n
        for d0 in range(0, D, BLOCK):
            ok = d0 + cols < D
            tl.store(h_ptr + row * D + d0 + cols, tl.load(embed_ptr + tok * D + d0 + cols, mask=ok), mask=ok)
        if n == 0:
            slot = tl.load(slots_ptr + b * s_slot).to(tl.int64)
            length = tl.load(lens_ptr + slot)
            tl.store(lens_out_ptr + b, length)
            tl.store(slots_out_ptr + b, slot.to(tl.int32))
            if ADVANCE:
                tl.store(lens_ptr + slot, length + 1)


def step_prologue(tokens: torch.Tensor, slots: torch.Tensor, embed: torch.Tensor, lens: torch.Tensor,
                   advance: bool, tree: tuple[torch.Tensor, torch.Tensor] | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, TreeMeta | None]:
    """A step's inputs in one launch (:func:`_step_prologue_kernel`): ``tokens: [B, N]`` (a decode step: ``[B]``)
    and ``slots: [B]`` integer (any strides) -> the residual stream ``[B N, Dm]`` (the tokens' embeddings), the
    slots ``[B]`` int32 and their committed lengths ``[B]`` before the step; with ``advance`` (a decode step,
    distinct slots) ``lens [P]`` then advances by one at those slots. ``tree = (parents [B, N], num_nodes [B])``
    (checked trees) also gives the step's :func:`~lumotree.optimized.ops.tree_meta.tree_metadata` (else None)."""
    tokens2 = tokens[:, None] if tokens.ndim == 1 else tokens  # [B, N]
    B, N = tokens2.shape
    D = embed.shape[1]
    h = torch.empty((B * N, D), dtype=embed.dtype, device=embed.device)  # [B N, Dm]
    slots_out = torch.empty((B,), dtype=torch.int32, device=embed.device)  # [B]
    lens_out = torch.empty((B,), dtype=lens.dtype, device=embed.device)  # [B]
    meta = None
    if tree is None:
        parents = num_nodes = words = depth = tokens2  # unread
        consts = dict(NP=1, BLOCK_W=1, ROUNDS=1)
    else:
        parents, num_nodes = tree  # [B, N], [B]
        meta, consts = tree_metadata_buffers(B, N, embed.device)
        words, depth = meta
    _step_prologue_kernel[(B, N + (tree is not None))](
        tokens2, slots, tokens2.stride(0), tokens2.stride(1), slots.stride(0), embed, lens, h, slots_out, lens_out,
        N, D, parents, num_nodes, words, depth, parents.stride(0), parents.stride(1), words.shape[-1],
        BLOCK=min(4096, triton.next_power_of_2(D)), ADVANCE=bool(advance), TREE=tree is not None,
        PDL=pdl_supported(embed.device), **consts, **launch_opts(4))
    return h, slots_out, lens_out, meta


def launch_opts(num_warps: int) -> dict:
    return {} if interpreting() else {"num_warps": num_warps}


def add_rmsnorm(h: torch.Tensor, delta: torch.Tensor | None, weight1p: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm ``x * rsqrt(mean(x^2) + eps) * (1 + w)`` of the residual stream ``h: [T, Dm]`` after
    ``h += delta`` in place (``delta: [T, Dm]`` or None; ``weight1p = 1 + w`` fp32). Returns ``[T, Dm]``."""
    T, D = h.shape
    out = torch.empty_like(h)  # [T, Dm]
    has_delta = delta is not None
    _add_rmsnorm_kernel[(T,)](h, delta if has_delta else h, weight1p, out, D, float(eps), HAS_DELTA=has_delta,
                              BLOCK=triton.next_power_of_2(D), PDL=pdl_supported(h.device),
                              **launch_opts(8 if D >= 2048 else 4))
    return out


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """SwiGLU activation of the fused gate | up projection ``gu: [T, 2I]`` (columns interleaved,
    :func:`~lumotree.optimized.ops.gemv.interleave_gate_up`) -> ``[T, I]``."""
    T, two_i = gu.shape
    inner = two_i // 2
    out = torch.empty((T, inner), dtype=gu.dtype, device=gu.device)  # [T, I]
    block = min(1024, triton.next_power_of_2(inner))
    _silu_mul_kernel[(T, triton.cdiv(inner, block))](gu, out, inner, BLOCK=block, PDL=pdl_supported(gu.device),
                                                     **launch_opts(4))
    return out
