"""Block-FP8 linear layers: ``y = x @ W.T`` with ``W`` held as float8_e4m3fn values and per-block float32 scales
(the fine-grained FP8 format of the family's FP8 releases, :mod:`lumotree.reference.fp8`), dequantised inside the
kernels.

Weight (:class:`Fp8Weight`): ``weight: [N, K]`` float8_e4m3fn, ``scale: [R, cdiv(K, 128)]`` float32 and
``scale_rows: [N]`` int32; output row ``n`` of the weight stands for ``W[n, k] = weight[n, k] * scale[scale_rows[n],
k // 128]``. A checkpoint tensor has ``scale_rows[n] = n // 128`` (:meth:`Fp8Weight.from_blocks`); the row index makes
the model's fused weights exact without requantising: concatenated projections (:func:`fp8_cat`), permuted rows (the
GDN layer's head-major order, :meth:`Fp8Weight.take_rows`) and SwiGLU's interleaved gate / up rows
(:func:`~lumotree.optimized.ops.gemv.interleave_gate_up`) keep each row's own scales. Experts stack as ``weight:
[E, N, K]``, ``scale: [E, R, cdiv(K, 128)]`` with one ``scale_rows: [N]`` (:meth:`Fp8Weight.expert` is expert ``e``'s
matrix): the interface a grouped expert kernel reads.

Two kernels, both with fp32 accumulation and the scales applied per 128-column block to the fp32 partial products
(``y[m, n] = sum_b scale[r(n), b] sum_{k in block b} x[m, k] q[n, k]``: the e4m3 values are exact in bf16 and fp32, so
each block's product is the one of the dequantised weight up to the order of the sums):

- few rows (decode, tree steps; M <= 64): the split-K GEMV (:func:`~lumotree.optimized.ops.gemv.small_batch_linear`,
  :func:`~lumotree.optimized.ops.gemv.residual_linear` take an :class:`Fp8Weight` for ``w``), which streams the fp8
  weight (half the bytes of bf16) with every fused neighbour (SwiGLU, norms, the residual add, the convs): broadcast +
  ``tl.sum`` on 128-column sub-tiles, each times its rows' scales, or ``tl.dot`` on weight tiles converted to x's dtype
  in registers, the product times the tile's scales;
- many rows (prefill chunks; any M): :func:`fp8_linear`'s tiled ``tl.dot`` kernel (``[64, 128]`` x ``[128, 128]``
  tiles, the weight tile converted to x's dtype, one scale per row and K tile).

Activations are not quantised (transformers' ``FP8Linear`` quantises them per token and 128-column group to use the
fp8 tensor cores): the result is the dequantised model's, which the reference backend computes exactly, and greedy
decoding follows it token for token. At decode sizes the weight bytes are the cost, not the multiplies; fp8 tensor
cores would help compute-bound prefill only.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..checks import interpreting

__all__ = ["Fp8Weight", "fp8_linear", "fp8_cat", "FP8_BLOCK_K"]

#: the scale blocks' width (columns): every kernel tile lies inside one block or spans whole blocks
FP8_BLOCK_K = 128
_FP8 = torch.float8_e4m3fn


class Fp8Weight(NamedTuple):
    """A block-FP8 linear weight (module docstring): ``weight: [N, K]`` (experts: ``[E, N, K]``) float8_e4m3fn
    contiguous, ``scale: [R, cdiv(K, 128)]`` (``[E, R, cdiv(K, 128)]``) float32 contiguous, ``scale_rows: [N]`` int32
    (values in ``[0, R)``). ``tail``: more output rows ``[N2, K]`` stored in a float dtype (x's), after the FP8 ones
    (a fused projection whose last parts a checkpoint keeps float, as releases keep ``in_proj_ba``): the weight is
    then ``[N + N2, K]``, computed as two launches into one output (2-D weights only)."""

    weight: torch.Tensor
    scale: torch.Tensor
    scale_rows: torch.Tensor
    tail: torch.Tensor | None = None

    @property
    def shape(self) -> torch.Size:
        if self.tail is None:
            return self.weight.shape
        return torch.Size((self.weight.shape[0] + self.tail.shape[0], self.weight.shape[1]))

    @property
    def head(self) -> Fp8Weight:
        """The FP8 rows alone (no tail)."""
        return self if self.tail is None else Fp8Weight(self.weight, self.scale, self.scale_rows)

    @property
    def device(self) -> torch.device:
        return self.weight.device

    @property
    def is_cuda(self) -> bool:
        return self.weight.is_cuda

    @classmethod
    def from_blocks(cls, weight: torch.Tensor, scale_inv: torch.Tensor, block_rows: int = 128) -> Fp8Weight:
        """A checkpoint's ``weight: [..., N, K]`` and ``weight_scale_inv: [..., >= cdiv(N, block_rows), cdiv(K,
        128)]`` (row ``n`` uses scale row ``n // block_rows``), checked."""
        if not isinstance(weight, torch.Tensor) or weight.dtype != _FP8 or weight.ndim not in (2, 3):
            raise ValueError("weight must be a float8_e4m3fn tensor [N, K] or [E, N, K]")
        N, K = weight.shape[-2:]
        rows = torch.arange(N, device=weight.device, dtype=torch.int32) // block_rows  # [N]
        return cls(weight.contiguous(), scale_inv.contiguous(), rows).checked()

    @classmethod
    def quantize(cls, w: torch.Tensor) -> Fp8Weight:
        """Block FP8 of a float weight ``w: [..., N, K]`` (as :func:`lumotree.reference.fp8.quantize_blocks`, on
        w's device): per 128 x 128 block ``scale = amax|w| / 448`` (1 for a zero block), ``q = e4m3(w / scale)``."""
        *lead, N, K = w.shape
        rb, kb = triton.cdiv(N, 128), triton.cdiv(K, FP8_BLOCK_K)
        padded = torch.zeros((*lead, rb * 128, kb * FP8_BLOCK_K), dtype=torch.float32, device=w.device)
        padded[..., :N, :K] = w
        tiles = padded.view(*lead, rb, 128, kb, FP8_BLOCK_K)  # [..., rb, 128, kb, 128]
        amax = tiles.abs().amax(dim=(-3, -1))  # [..., rb, kb]
        scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))  # [..., rb, kb]
        q = (tiles / scale[..., :, None, :, None]).clamp(-448.0, 448.0).to(_FP8)
        q = q.view(*lead, rb * 128, kb * FP8_BLOCK_K)[..., :N, :K].contiguous()  # [..., N, K]
        del padded, tiles
        return cls.from_blocks(q, scale.contiguous())

    def checked(self) -> Fp8Weight:
        """Self after checking dtypes, shapes and the row indices (reads them to the host once)."""
        w, s, r, tail = self
        N, K = w.shape[-2:]
        if tail is not None and (w.ndim != 2 or tail.ndim != 2 or tail.shape[1] != K or not tail.is_floating_point()
                                 or not tail.is_contiguous() or tail.device != w.device):
            raise ValueError(f"tail must be a contiguous float [N2, {K}] on the weight's device, got "
                             f"{tail.dtype} {list(tail.shape)}")
        kb = triton.cdiv(K, FP8_BLOCK_K)
        if w.dtype != _FP8 or not w.is_contiguous():
            raise ValueError(f"weight must be contiguous float8_e4m3fn, got {w.dtype}")
        if s.dtype != torch.float32 or s.ndim != w.ndim or s.shape[-1] != kb or s.shape[:-2] != w.shape[:-2] \
                or not s.is_contiguous():
            raise ValueError(f"scale has shape {list(s.shape)} and dtype {s.dtype}; expected float32 [..., R, {kb}] "
                             f"for a weight of shape {list(w.shape)}")
        if r.dtype != torch.int32 or r.shape != (N,):
            raise ValueError(f"scale_rows must be int32 [{N}], got {r.dtype} {list(r.shape)}")
        if N and not 0 <= int(r.min()) <= int(r.max()) < s.shape[-2]:
            raise ValueError(f"scale_rows must index the {s.shape[-2]} scale rows")
        return self

    def expert(self, e: int) -> Fp8Weight:
        """Expert ``e``'s ``[N, K]`` weight of a stacked ``[E, N, K]`` one (views, no copy)."""
        if self.weight.ndim != 3:
            raise ValueError(f"expert() needs a stacked [E, N, K] weight, got {list(self.weight.shape)}")
        return Fp8Weight(self.weight[e], self.scale[e], self.scale_rows)

    def take_rows(self, index: torch.Tensor) -> Fp8Weight:
        """The weight of rows ``index`` (the scales shared, the row indices gathered; no tail)."""
        if self.tail is not None:
            raise ValueError("take_rows: permute the parts before giving the weight a float tail")
        return Fp8Weight(self.weight[..., index, :].contiguous(), self.scale, self.scale_rows[index].contiguous())

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``W = weight * scale[scale_rows, k // 128]`` in fp32 (float64: exact), rounded to ``dtype``:
        ``[..., N, K]``."""
        K = self.weight.shape[-1]
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        per_row = self.scale[..., self.scale_rows.long(), :].to(compute)  # [..., N, Kb]
        full = per_row.repeat_interleave(FP8_BLOCK_K, dim=-1)[..., :K]  # [..., N, K]
        w = (self.weight.to(compute) * full).to(dtype)
        return w if self.tail is None else torch.cat([w, self.tail.to(dtype)])  # [N + N2, K]


def fp8_cat(parts: list[Fp8Weight]) -> Fp8Weight:
    """The row concatenation of block-FP8 weights of one K (and one expert count): weights and scale rows stacked,
    each part's row indices shifted past the scale rows before it."""
    rows, at = [], 0
    if any(p.tail is not None for p in parts):
        raise ValueError("fp8_cat: the parts must have no float tail")
    for p in parts:
        rows.append(p.scale_rows + at)
        at += p.scale.shape[-2]
    return Fp8Weight(torch.cat([p.weight for p in parts], dim=-2), torch.cat([p.scale for p in parts], dim=-2),
                     torch.cat(rows))


@triton.jit
def _fp8_matmul_kernel(x_ptr, w_ptr, s_ptr, r_ptr, y_ptr, M, N, K, n_kb, s_xm, s_ym, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr):
    """Program ``(i, j)``: ``y[i BM : (i + 1) BM, j BN : (j + 1) BN]`` over every K tile (``BLOCK_K`` divides 128:
    one scale per weight row and tile): ``acc += (x_tile @ q_tile^T) * scale[r(n), k0 // 128]``."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # [BM]
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BN]
    ks = tl.arange(0, BLOCK_K)  # [BK]
    cols_in = tl.minimum(cols, N - 1)  # clamped: in bounds, never stored
    srow = tl.load(r_ptr + cols_in).to(tl.int64) * n_kb  # [BN]
    x_rows = x_ptr + tl.minimum(rows, M - 1).to(tl.int64)[:, None] * s_xm  # [BM, 1]
    w_rows = w_ptr + cols_in.to(tl.int64)[:, None] * K  # [BN, 1]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)  # [BM, BN]
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + ks)[None, :] < K  # [1, BK]
        x = tl.load(x_rows + k0 + ks[None, :], mask=k_ok, other=0.0)  # [BM, BK]
        w = tl.load(w_rows + k0 + ks[None, :], mask=k_ok, other=0.0).to(x_ptr.dtype.element_ty)  # [BN, BK]
        scale = tl.load(s_ptr + srow + k0 // 128)  # [BN]
        if IEEE:
            part = tl.dot(x, tl.trans(w), input_precision="ieee")  # [BM, BN]
        else:
            part = tl.dot(x, tl.trans(w))  # [BM, BN]
        acc += part * scale[None, :]
    ok = (rows < M)[:, None] & (cols < N)[None, :]
    tl.store(y_ptr + rows[:, None] * s_ym + cols[None, :], acc.to(y_ptr.dtype.element_ty), mask=ok)


def fp8_linear(x: torch.Tensor, w: Fp8Weight, *, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``y = x @ W.T`` for any number of rows: ``x: [M, K]`` float (contiguous last dim), ``w`` an
    :class:`Fp8Weight` ``[N, K]`` on x's device; fp32 accumulation; returns ``y: [M, N]`` in ``out_dtype`` (None: x's
    dtype). Up to :data:`~lumotree.optimized.ops.gemv.MAX_ROWS` rows on the split-K GEMV, above on the tiled
    ``tl.dot`` kernel (module docstring); without a GPU or the Triton interpreter, the dequantised weight's matmul."""
    from .kernels import MAX_ROWS, OUT_DTYPES
    from .linear import small_batch_linear

    if not isinstance(w, Fp8Weight):
        raise TypeError(f"w must be an Fp8Weight, got {type(w).__name__}")
    if not isinstance(x, torch.Tensor) or x.ndim != 2 or x.dtype not in (torch.float32, torch.bfloat16,
                                                                        torch.float16):
        raise ValueError("x must be a float tensor [M, K] (float32, bfloat16 or float16)")
    if w.weight.ndim != 2 or w.weight.shape[1] != x.shape[1]:
        raise ValueError(f"w has shape {list(w.shape)}; expected [N, {x.shape[1]}] (x's K)")
    if w.device != x.device:
        raise ValueError(f"w is on {w.device}, x on {x.device}")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be one of None, bfloat16, float16, float32, got {out_dtype!r}")
    M, K = x.shape
    N = w.shape[0]
    if not (x.is_cuda or interpreting()):
        return (x.float() @ w.dequantize().T).to(out_dtype or x.dtype)  # [M, N]
    if x.stride(1) != 1:
        x = x.contiguous()
    if 1 <= M <= MAX_ROWS:
        return small_batch_linear(x, w, out_dtype=out_dtype)
    y = torch.empty((M, N), dtype=out_dtype or x.dtype, device=x.device)  # [M, N]
    if M == 0:
        return y
    if w.tail is not None:  # the float rows: cuBLAS, into their columns
        n1 = w.weight.shape[0]
        y[:, n1:] = x @ w.tail.T
        w, y_all, y = w.head, y, y[:, :n1]
    else:
        y_all = y
    N = w.shape[0]
    block_m, block_n, block_k = 64, 128, 128
    opts = {} if interpreting() else {"num_warps": 8, "num_stages": 3}
    _fp8_matmul_kernel[(triton.cdiv(M, block_m), triton.cdiv(N, block_n))](
        x, w.weight, w.scale, w.scale_rows, y, M, N, K, w.scale.shape[-1], x.stride(0), y.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, IEEE=x.dtype == torch.float32, **opts)
    return y_all
