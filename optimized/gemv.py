r"""Small-batch linear layer ``y = x @ w.T`` for decode and small tree steps (M <= 64 token rows), streaming the
weight once.

Math: ``y[m, n] = sum_k x[m, k] w[n, k]`` with ``x: [M, K]``, ``w: [N, K]`` row-major (a ``nn.Linear`` weight),
products and sums in fp32, ``y: [M, N]`` rounded once to ``out_dtype`` (default: the input dtype).

Memory floor: at small M the weight is the traffic (``x`` and ``y`` are ``M (K + N)`` elements against ``N K``), so a
call cannot take less than ``bytes(w) / bandwidth``: ``2 N K / 4.26 TB/s`` for bf16 on an H200 (copy bandwidth),
e.g. 11.9 us for the ``[12352, 2048]`` projection and 146 us for the ``[151936, 2048]`` LM head.

Kernel (:func:`_gemv_kernel`, grid ``(cdiv(N, BLOCK_N), SPLIT_K)``): program ``(j, s)`` owns output columns
``n in [j BLOCK_N, (j + 1) BLOCK_N)`` (rows of ``w``) and the K-range ``[s Ks, min((s + 1) Ks, K))`` (``Ks`` a
multiple of ``BLOCK_K``). Each iteration loads one ``[BLOCK_N, BLOCK_K]`` tile of ``w`` (K contiguous: 16-byte
vector loads, ``BLOCK_N BLOCK_K / (32 num_warps)`` elements per thread, all independent, so a large tile puts many
bytes in flight; rows past N are clamped to row N - 1, so the loads stay in bounds and unmasked, their results are
never stored) and the matching ``x`` chunk (rows past M masked off). Two forms of the tile product (``use_dot``):

- broadcast + ``tl.sum`` (the default at M = 1; up to 8 rows by config): ``acc3[m, n, k] += x[m, k] w[n, k]``
  elementwise in fp32 on a ``[M_PAD, BLOCK_N, BLOCK_K]`` register tile (``M_PAD`` = M rounded up to a power of two), one
  ``tl.sum`` over k after the loop, so the loop has no shuffles and no shared memory; x's pointers are broadcast over n
  (stride 0) so its load gets w's register layout (one L1-resident x load per w load and row of x). Registers grow as
  ``M_PAD BLOCK_N BLOCK_K / (32 num_warps)`` (sm_90 build, Triton 3.6, 4 warps: 146 at M = 1 on 16 x 512 tiles, 167
  at M = 2 on 16 x 256, 255 and spills at M = 4 on 16 x 256). ``num_stages`` changes nothing here: Triton does not
  pipeline these loads; the bytes in flight come from the tile size and the programs resident per SM;
- ``tl.dot`` (default for M >= 2; the only form above 8 rows): x padded to ``max(16, next_pow2(M))`` rows (the
  padding masked, not read), ``acc = x w^T`` on the tensor cores, the tiles pipelined through shared memory over
  ``num_stages``. Each program re-reads its K-range of x from L2, ``cdiv(N, BLOCK_N)`` times in all: at 64 rows
  that is as many bytes as the weight for ``BLOCK_N = 64``, hence the wider tiles there.

Fused neighbours (one launch and one round trip less each): ``swiglu=True`` computes SwiGLU's ``silu(gate) * up`` in
the gate | up projection's epilogue, from a weight whose rows interleave the gate and up rows
(:func:`interleave_gate_up`: row ``2j`` is ``gate_j``, row ``2j + 1`` is ``up_j``, so a program's block holds both
halves of its outputs; ``y: [M, N / 2]``, the rounding of the GEMV followed by the separate SwiGLU kernel). The
residual add + RMSNorm between two projections, ``x' = RMSNorm(h + x W1^T) = (h' * g) / rms(h')`` then ``x' W2^T``,
is split over the two GEMVs: :func:`residual_linear` adds its product into ``h`` in the epilogue (``h' = round(h +
round(x W1^T))``, by the program that stores the row block) and stores, per row block, its share of each row's sum
of squares and the rows scaled by the norm weight ``round(h' * g)``; the next launch, ``small_batch_linear(round(h'
* g), W2, norm=RowNorm(parts, eps))``, streams those rows like any ``x`` and multiplies row m of its product by
``rsqrt(sum(parts[m]) / K + eps)`` (every program sums the same parts in the same order). The result equals
``RMSNorm(h') W2^T`` exactly in real arithmetic; in floating point the rounding moves (``h' g`` is rounded instead
of ``h' g / rms``, and the sum of squares runs in another order), an error of the size of the one rounding either
way. Applying ``rstd * g`` to each x tile in the loads instead measured 1.8x slower at one row (the broadcast tiles
repeat that work ``BLOCK_N`` times; ``bench/decode_probe.py --what fused``). Parts ``[M, S, R]`` make the factor
one per segment of ``K / S`` columns (a head of a per-head norm such as the GDN layer's gated RMSNorm, whose other
half the verify kernel does: :class:`~lumotree.optimized.gdn_tree.OutputGate`): each K tile's product is scaled by
its segment's factors, loaded for the split before the loop (``tl.dot`` form). ``conv=ConvStep(...)``: the first ``C``
output columns (the GDN layer's q | k | v) go through one decode step of the depthwise causal conv in the epilogue,
the conv state shifted in place by the program that owns those channels (no other program reads them; one K split,
since the conv needs the block's whole sum): bit-identical to the GEMV followed by
:func:`~lumotree.optimized.gdn_decode.conv_step`.

In a tree step (``TreeConv``, rows = the step's nodes, all in every program of the ``tl.dot`` form) the ``w_in``
projection's first ``C`` columns also go through the tree-window conv in the epilogue: each row's window is gathered
from the block's product in registers along the parents (gathered the same way) and, past the root, from the
committed conv state; ``y`` keeps the inputs (the commit's conv rows) and ``out`` gets ``act(conv)``, the values of
:func:`~lumotree.optimized.conv_tree.tree_conv`. ``GemvConfig.tma`` fetches the ``tl.dot`` form's tiles through
tensor descriptors instead (measured within +-0.5 us of the per-thread loads on the bench shapes; off by default).

Split-K reduction, deterministic and in the same launch: with ``SPLIT_K == 1`` the program writes ``y`` directly.
Otherwise split ``s`` stores its fp32 partial ``[M, BLOCK_N]`` to ``partials[s]`` (scratch ``[SPLIT_K, M, N]``),
then (CTA barrier, one acq_rel atomic) increments the row block's counter; the program that reads back
``SPLIT_K - 1`` is the last one, reads ``partials[0] + partials[1] + ... + partials[SPLIT_K - 1]`` in that fixed
order (L2 loads, ``.cg``, unrolled so that they are all in flight at once), so the result is bit-identical
whichever program finishes last, writes ``y`` and resets the counter to 0 (a CUDA graph replays it unchanged).
Scratch and counters (``torch.zeros``) are cached per
(device, M, N, BLOCK_N, SPLIT_K): a graph capture after one eager call allocates nothing. Calls that share a cached
scratch must be stream-ordered (one stream, as the model's forward): two concurrent calls of one shape on different
streams would race on it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ._checks import (FLOAT_DTYPES, check_num_nodes, check_slots, check_tensor, check_tree_rows, interpreting,
                      tma_possible)
from .pdl import pdl_supported

__all__ = ["GemvConfig", "RowNorm", "ResidualRows", "ConvStep", "TreeConv", "gemv_config", "small_batch_linear",
           "residual_linear", "split_k_scratch", "preferred", "interleave_gate_up", "MAX_ROWS", "MAX_SUM_ROWS",
           "MAX_NORM_PARTS", "WIDE_N", "OUT_DTYPES"]

MAX_ROWS = 64  # the largest M (token rows) the kernel is built for
MAX_SUM_ROWS = 8  # the broadcast + sum form's limit (its registers grow with M)
WIDE_N = 65536  # outputs at least this wide (LM heads): the default launch beat cuBLAS up to MAX_ROWS rows
OUT_DTYPES = (None, torch.bfloat16, torch.float16, torch.float32)


EARLY_TRIGGER_MAX_ROWS = 8  # PDL launches of up to this many rows signal the next kernel before their wait, larger
# ones after it (H200, bench/model_verify.py --pdl-trigger, 2026-12-01, eighth session: signalling after the wait
# made the B = 16 decode step 2292 -> 2140 us and the B = 1, N = 32 verify 1986 -> 1929 us, and the B = 1 decode
# 1350 -> 1365 us; N = 64 verify 2042 -> 2051 us)
PDL_EARLY_TRIGGER: bool | None = None  # None: the rule above; True / False: always before / after (an A / B knob)
MAX_NORM_PARTS = 4096  # the most pieces of a row's sum of squares a norm prologue reads (one load per program)
#: warps of the default launch of a per-segment RowNorm GEMV (None: 8 above 32 rows, else the config rule's; an A / B
#: knob)
SEGMENT_NORM_WARPS: int | None = None


class RowNorm(NamedTuple):
    """The per-row factor a GEMV applies to its product: row m times ``rsqrt(sum(parts[m]) / K + eps)``, with
    ``parts: [M, R]`` fp32 the rows' sums of squares in pieces (as :func:`residual_linear` leaves them) and
    ``eps > 0``. ``parts: [M, S, R]``: per segment instead, row m's ``s``-th segment of ``K / S`` columns (an
    attention or GDN head) times ``rsqrt(sum(parts[m, s]) / (K / S) + eps)``, applied to each K tile's product
    (the ``tl.dot`` form, tiles inside one segment: ``block_k`` divides ``K / S``): ``y = sum_s rstd[m, s]
    x[m, seg s] w[:, seg s]^T``, e.g. a gated RMSNorm per head whose ``x = round(w_norm o silu(z))`` and parts
    the fused GDN verify left (:class:`~lumotree.optimized.gdn_tree.OutputGate`)."""

    parts: torch.Tensor
    eps: float


class ResidualRows(NamedTuple):
    """What :func:`residual_linear` leaves besides the updated residual ``h: [M, N]``: ``parts: [M, R]`` fp32, the
    new rows' sums of squares in ``R`` pieces (``parts.sum(-1) = (h.float() ** 2).sum(-1)``), and ``scaled: [M, N]``
    = ``round(h * scale)`` (None without a ``scale``)."""

    parts: torch.Tensor
    scaled: torch.Tensor | None


class ConvStep(NamedTuple):
    """One step of a depthwise causal conv applied to a GEMV's first ``C`` output columns (the GDN layer's q | k | v
    inputs): ``weight: [C, W]``, ``state_pool: [P, W - 1, C]`` fp32 (oldest row first) advanced in place at
    ``slots: [M]`` (row m of ``x`` is the token of the request at ``slots[m]``; distinct), ``silu``: SiLU after the
    conv (else none). Same math as :func:`~lumotree.optimized.gdn_decode.conv_step`."""

    weight: torch.Tensor
    state_pool: torch.Tensor
    slots: torch.Tensor
    silu: bool = True


class TreeConv(NamedTuple):
    """The tree-window depthwise conv applied to a GEMV's first ``C`` output columns in a tree step (the GDN layer's
    q | k | v inputs for every node): row ``r`` of ``x`` is node ``r % N`` of request ``r // N``; ``weight: [C, W]``,
    ``state_pool: [P, W - 1, C]`` (read at ``slots: [B]``, not modified), ``parents: [B, N]`` int32 contiguous,
    ``num_nodes: [B]`` int32 (padding nodes give zeros), ``out: [B, N, C]`` contiguous, y's dtype: receives
    ``act(conv)`` while ``y`` keeps the inputs. Same math and values as
    :func:`~lumotree.optimized.conv_tree.tree_conv` on ``y[:, :C]`` (no bias)."""

    weight: torch.Tensor
    state_pool: torch.Tensor
    slots: torch.Tensor
    parents: torch.Tensor
    num_nodes: torch.Tensor
    out: torch.Tensor
    silu: bool = True


class GemvConfig(NamedTuple):
    """Launch parameters: ``[block_n, block_k]`` weight tiles (powers of two), ``split_k`` K-ranges per row block
    (the launch uses at most ``cdiv(K, block_k)``), Triton ``num_warps`` / ``num_stages``, ``use_dot``: the tile
    product on ``tl.dot`` (needs ``block_n, block_k >= 16``) instead of broadcast + ``tl.sum``, and ``tma``
    (``use_dot`` only): the ``w`` and ``x`` tiles fetched by the tensor-memory accelerator through host-built tensor
    descriptors instead of per-thread loads (tiles past the edges zero-filled by the hardware)."""

    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int
    use_dot: bool = False
    tma: bool = False


# ------------------------------------------------------------------------------------------------------------ kernel
@triton.jit
def _store_swiglu(val, y_ptr, s_ym, rows, pid_n, M, N, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr):
    """SwiGLU of the fp32 block ``val: [M_PAD, BLOCK_N]`` of interleaved gate / up columns (column ``2j``: gate_j,
    ``2j + 1``: up_j; :func:`interleave_gate_up`): both rounded to y's dtype as a plain GEMV would store them, then
    ``silu(g) * u`` in fp32 (the separate SwiGLU kernel's math), rounded once into ``y[m, j]`` (``N / 2`` columns)."""
    pairs = val.to(y_ptr.dtype.element_ty).to(tl.float32)  # [M_PAD, BLOCK_N]
    g, u = tl.split(tl.reshape(pairs, [M_PAD, BLOCK_N // 2, 2]))  # [M_PAD, BLOCK_N / 2] each
    half = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)  # [BLOCK_N / 2] output columns
    tl.store(y_ptr + rows[:, None] * s_ym + half[None, :], (g * tl.sigmoid(g) * u).to(y_ptr.dtype.element_ty),
             mask=(rows < M)[:, None] & (half < N // 2)[None, :])


@triton.jit
def _segment_rstd(parts_ptr, rows, M, seg0, seg_len, eps, N_PARTS, SEGMENTS: tl.constexpr, PARTS_PAD: tl.constexpr,
                  SEG_BLOCK: tl.constexpr):
    """``rsqrt(sum_j parts[m, s, j] / seg_len + eps)`` for the block's rows and the segments ``s = seg0 ..
    seg0 + SEG_BLOCK - 1`` (``parts: [M, SEGMENTS, N_PARTS]`` fp32, summed in a fixed order: every program the same
    factor): ``[M_PAD, SEG_BLOCK]``."""
    seg = seg0 + tl.arange(0, SEG_BLOCK)  # [SEG_BLOCK]
    j = tl.arange(0, PARTS_PAD)  # [PARTS_PAD]
    ok = (rows < M)[:, None, None] & (seg < SEGMENTS)[None, :, None] & (j < N_PARTS)[None, None, :]
    sq = tl.load(parts_ptr + (rows[:, None, None] * SEGMENTS + seg[None, :, None]) * N_PARTS + j[None, None, :],
                 mask=ok, other=0.0)  # [M_PAD, SEG_BLOCK, PARTS_PAD]
    return 1.0 / tl.sqrt(tl.sum(sq, axis=2) / seg_len + eps)


@triton.jit
def _tile_product(acc, x, w, seg_rstd, seg_off, IEEE: tl.constexpr, SEGMENTED: tl.constexpr,
                  SEG_BLOCK: tl.constexpr):
    """``acc + x w^T`` on the tensor cores (``IEEE``: fp32 FMA). ``SEGMENTED`` (a per-segment :class:`RowNorm`):
    the tile lies in the split's ``seg_off``-th segment, whose factors (column ``seg_off`` of the split's
    ``seg_rstd [M_PAD, SEG_BLOCK]``) scale its product. Measured slower on the H200 (bench/NOTES-attention.md,
    tenth session): scaling the x tile instead, rounded to x's dtype, so that the accumulation stays on the tensor
    cores (the model's ``[2048, 4096]`` launch at 64 rows 12 -> 98 us), and two tiles' products formed before
    either is scaled (11.6 -> 14.0 us)."""
    if SEGMENTED:
        pick = tl.arange(0, SEG_BLOCK)[None, :] == seg_off  # [1, SEG_BLOCK]
        rstd = tl.sum(tl.where(pick, seg_rstd, 0.0), axis=1)  # [M_PAD]
        if IEEE:
            return acc + tl.dot(x, tl.trans(w), input_precision="ieee") * rstd[:, None]
        return acc + tl.dot(x, tl.trans(w)) * rstd[:, None]
    if IEEE:
        return tl.dot(x, tl.trans(w), acc, input_precision="ieee")  # [M_PAD, BLOCK_N]
    return tl.dot(x, tl.trans(w), acc)  # [M_PAD, BLOCK_N]


@triton.jit
def _store_y(val, y_ptrs, out_ok, rows, cols, M, N, pid_n, parts_ptr, N_PARTS, scale_ptr, scaled_ptr,
             RESIDUAL: tl.constexpr, SCALED: tl.constexpr):
    """Store the fp32 block ``val: [M_PAD, BLOCK_N]``: ``y = val`` rounded, or (``RESIDUAL``: ``y`` is the residual
    ``h``) ``h = round(h + round(val))``, this block's share of each row's sum of squares of the new ``h`` into
    ``parts[m, pid_n]`` and (``SCALED``) ``scaled = round(h * scale)`` (``scale: [N]`` fp32)."""
    if RESIDUAL:
        delta = val.to(y_ptrs.dtype.element_ty).to(tl.float32)
        h = (tl.load(y_ptrs, mask=out_ok, other=0.0).to(tl.float32) + delta).to(y_ptrs.dtype.element_ty)
        tl.store(y_ptrs, h, mask=out_ok)
        hf = tl.where(out_ok, h.to(tl.float32), 0.0)  # [M_PAD, BLOCK_N]
        tl.store(parts_ptr + rows * N_PARTS + pid_n, tl.sum(hf * hf, axis=1), mask=rows < M)
        if SCALED:
            scale = tl.load(scale_ptr + cols, mask=cols < N, other=0.0)  # [BLOCK_N]
            tl.store(scaled_ptr + rows[:, None] * N + cols[None, :], (hf * scale[None, :]).to(h.dtype), mask=out_ok)
    else:
        tl.store(y_ptrs, val.to(y_ptrs.dtype.element_ty), mask=out_ok)


@triton.jit
def _conv_step_columns(val, rows, cols, M, slots_ptr, conv_w_ptr, conv_pool_ptr, C,
                       WIDTH: tl.constexpr, RP: tl.constexpr, SILU: tl.constexpr):
    """One step of the depthwise causal conv on the block's first-``C`` columns (``val: [M_PAD, BLOCK_N]`` fp32, the
    product as rounded to y's dtype; row m is the token of the request at ``slots[m]``): returns the block with those
    columns replaced by ``act(sum_{t < W-1} w[c, t] state[t, c] + w[c, W-1] x[c])`` and shifts each state by one row
    (``state <- (state[1:], x)``, fp32 pool ``[P, W - 1, C]``) in place: every channel of a row belongs to one
    program, so no other program reads it (:func:`~lumotree.optimized.gdn_decode.conv_step`'s math)."""
    taps = tl.arange(0, RP)  # [RP] state rows, oldest first
    ch_ok = (rows < M)[:, None, None] & (cols < C)[None, None, :]  # [M_PAD, 1, BLOCK_N]
    tap_ok = ch_ok & (taps < WIDTH - 1)[None, :, None]  # [M_PAD, RP, BLOCK_N]
    slot = tl.load(slots_ptr + rows, mask=rows < M, other=0).to(tl.int64)  # [M_PAD]
    state = conv_pool_ptr + slot[:, None, None] * ((WIDTH - 1) * C) + cols[None, None, :]  # [M_PAD, 1, BLOCK_N]
    old = tl.load(state + taps[None, :, None] * C, mask=tap_ok, other=0.0).to(tl.float32)  # [M_PAD, RP, BLOCK_N]
    nxt = tl.load(state + (taps + 1)[None, :, None] * C, mask=tap_ok & (taps + 1 < WIDTH - 1)[None, :, None],
                  other=0.0).to(tl.float32)  # [M_PAD, RP, BLOCK_N] row t + 1
    w_old = tl.load(conv_w_ptr + cols[None, None, :] * WIDTH + taps[None, :, None],
                    mask=(cols < C)[None, None, :] & (taps < WIDTH - 1)[None, :, None], other=0.0).to(tl.float32)
    w_new = tl.load(conv_w_ptr + cols * WIDTH + (WIDTH - 1), mask=cols < C, other=0.0).to(tl.float32)  # [BLOCK_N]
    y = tl.sum(old * w_old, axis=1) + w_new[None, :] * val  # [M_PAD, BLOCK_N]
    if SILU:
        y = y * tl.sigmoid(y)
    new = tl.where((taps == WIDTH - 2)[None, :, None], val[:, None, :], nxt)  # [M_PAD, RP, BLOCK_N]
    tl.debug_barrier()  # every thread's loads of the state are done before any store (in place)
    tl.store(state + taps[None, :, None] * C, new, mask=tap_ok)
    return tl.where((cols < C)[None, :], y, val)


@triton.jit
def _conv_tap(w_taps, j, WP: tl.constexpr):
    """Column ``j`` of ``w_taps [BLOCK_N, WP]`` (the channels' conv weights): ``[BLOCK_N]``, exactly."""
    return tl.sum(tl.where(tl.arange(0, WP)[None, :] == j, w_taps, 0.0), axis=1)


@triton.jit
def _tree_conv_rows(rows, cols, M, NODES, C, slots_ptr, num_nodes_ptr, parents_ptr, s_pb, conv_w_ptr, conv_pool_ptr,
                    M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, WIDTH: tl.constexpr, WP: tl.constexpr):
    """What the tree conv epilogue (:func:`_tree_conv_columns`) needs that does not depend on the product, computed
    before the K loop so that its loads overlap the weight stream: each row ``r`` (node ``r % NODES`` of request
    ``r // NODES``) gets ``req``, ``real`` (false on rows past M and on padding nodes) and ``parent_of_row``; the
    block's first-``C`` columns get their conv weights ``w_taps [BLOCK_N, WP]`` (fp32, tap j in column j) and
    ``state_acc [M_PAD, BLOCK_N]``, the committed-state taps already summed: tap ``d`` (``d > depth``, ``depth``
    the node's in-tree steps up to the root, at most ``W - 1``) reads state row ``W - 1 - d + depth``, the
    committed token ``d - depth`` before the root, in the order ``d = 1 .. W - 1`` of
    :func:`~lumotree.optimized.conv_tree.tree_conv` (the walk gathers the parents of every row from one load, in
    registers)."""
    req = rows // NODES  # [M_PAD] request of each row
    node = rows % NODES  # [M_PAD]
    row_ok = rows < M
    real = row_ok & (node < tl.load(num_nodes_ptr + req, mask=row_ok, other=0))  # [M_PAD]
    slot = tl.load(slots_ptr + req, mask=row_ok, other=0).to(tl.int64)  # [M_PAD]
    parent_of_row = tl.load(parents_ptr + req * s_pb + node, mask=real, other=0)  # [M_PAD] local node index
    chan_ok = cols < C  # [BLOCK_N]
    taps = tl.arange(0, WP)  # [WP]
    w_taps = tl.load(conv_w_ptr + cols[:, None] * WIDTH + taps[None, :],
                     mask=chan_ok[:, None] & (taps < WIDTH)[None, :], other=0.0).to(tl.float32)  # [BLOCK_N, WP]
    walk = node  # [M_PAD]
    depth = node * 0  # [M_PAD]
    for _ in tl.static_range(1, WIDTH):
        in_tree = walk >= 0
        walk = tl.where(in_tree, tl.gather(parent_of_row, req * NODES + tl.maximum(walk, 0), 0), walk - 1)
        depth += tl.where(walk >= 0, 1, 0)
    state = conv_pool_ptr + slot * ((WIDTH - 1) * C)  # [M_PAD] each row's request's [W - 1, C] state
    state_acc = tl.zeros([M_PAD, BLOCK_N], dtype=tl.float32)  # [M_PAD, BLOCK_N]
    for d in tl.static_range(1, WIDTH):
        from_state = tl.load(state[:, None] + (WIDTH - 1 - d + depth[:, None]) * C + cols[None, :],
                             mask=(real & (d > depth))[:, None] & chan_ok[None, :], other=0.0)  # [M_PAD, BLOCK_N]
        state_acc += _conv_tap(w_taps, WIDTH - 1 - d, WP)[None, :] * from_state.to(tl.float32)
    return req, real, parent_of_row, w_taps, state_acc


@triton.jit
def _tree_conv_columns(val, rows, cols, M, NODES, C, req, real, parent_of_row, w_taps, state_acc, out_ptr,
                       M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, WIDTH: tl.constexpr, WP: tl.constexpr,
                       SILU: tl.constexpr):
    """The tree conv of the block's first-``C`` columns (:class:`TreeConv`; ``val: [M_PAD, BLOCK_N]`` fp32, the
    product as rounded to y's dtype, every row of the step in this program; ``req, real, parent_of_row, w_taps``
    and the committed-state taps ``state_acc`` from :func:`_tree_conv_rows`): row r's window walks up its request's
    tree (``d`` steps up: row ``r // NODES * NODES + walk``, gathered from ``val`` in registers along
    ``parent_of_row``) and adds the tree taps to the state taps, in
    :func:`~lumotree.optimized.conv_tree.tree_conv`'s order (the same values); ``act(conv)`` is stored to
    ``out[r, c]`` (padding nodes: zeros)."""
    chan_ok = cols < C  # [BLOCK_N]
    acc = state_acc  # [M_PAD, BLOCK_N]
    walk = rows % NODES  # [M_PAD] the node d steps up; -e: the committed token e steps before the root
    for d in tl.static_range(WIDTH):
        in_tree = walk >= 0  # [M_PAD]
        src = req * NODES + tl.maximum(walk, 0)  # [M_PAD] the ancestor's row (<= r: parents precede children)
        from_tree = tl.gather(val, tl.broadcast_to(src[:, None], [M_PAD, BLOCK_N]), 0)  # [M_PAD, BLOCK_N]
        acc += _conv_tap(w_taps, WIDTH - 1 - d, WP)[None, :] * tl.where((real & in_tree)[:, None], from_tree, 0.0)
        if d < WIDTH - 1:
            walk = tl.where(in_tree, tl.gather(parent_of_row, src, 0), walk - 1)  # the root's parent: -1
    if SILU:
        acc = acc * tl.sigmoid(acc)
    acc = tl.where(real[:, None], acc, 0.0)  # padding rows: zeros
    tl.store(out_ptr + rows[:, None] * C + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(rows < M)[:, None] & chan_ok[None, :])


@triton.jit
def _gemv_kernel(
    x_ptr, w_ptr, x_desc, w_desc, y_ptr, part_ptr, count_ptr, norm_parts_ptr, out_parts_ptr, scale_ptr, scaled_ptr,
    M, N, K, s_xm, s_ym, k_per_split, SPLIT_K: tl.constexpr, eps, N_NORM_PARTS, norm_seg_len, N_OUT_PARTS,
    slots_ptr, conv_w_ptr, conv_pool_ptr, C_CONV, tc_num_nodes_ptr, tc_parents_ptr, s_tc_pb, tc_out_ptr, TC_NODES,
    M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    USE_DOT: tl.constexpr, TMA: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr, EARLY_TRIGGER: tl.constexpr,
    SWIGLU: tl.constexpr,
    NORM: tl.constexpr, NORM_SEGMENTS: tl.constexpr, SPLIT_SEGMENTS: tl.constexpr,
    NORM_PARTS_PAD: tl.constexpr, RESIDUAL: tl.constexpr, SCALED: tl.constexpr, CONV: tl.constexpr,
    CONV_WIDTH: tl.constexpr, CONV_RP: tl.constexpr, CONV_WP: tl.constexpr, CONV_SILU: tl.constexpr,
    TREE_CONV: tl.constexpr,
):  # fmt: skip
    """Program (row block j, split s): ``acc[m, n] = sum_{k in split s} x[m, k] w[n, k]`` over the block's n, then
    ``y = acc`` (one split) or the deterministic split-K reduction of the module docstring. ``PDL``: launched as a
    programmatic dependent launch (:mod:`~lumotree.optimized.pdl`): the program waits for the previous kernel before
    it touches memory (``x`` and the output buffers may be its work) and lets the next kernel launch, before that
    wait with ``EARLY_TRIGGER`` (decode-sized launches: the next GEMVs sit resident early), after it otherwise (a
    chain of waiting tree-step GEMVs would hold the SMs; :data:`EARLY_TRIGGER_MAX_ROWS`). Prefetching the first
    weight tiles into L2 before the wait measured slower (bench/NOTES-attention.md, "PDL"): not done.
    ``SWIGLU``: ``w``'s rows interleave gate and up (:func:`interleave_gate_up`) and the block that stores ``y``
    stores ``silu(gate) * up`` instead (:func:`_store_swiglu`; ``y: [M, N / 2]``).
    ``NORM``: row m of the product is multiplied by ``rsqrt(sum(norm_parts[m]) / K + eps)`` (the parts summed in a
    fixed order before the loop: every program the same factor); with ``NORM_SEGMENTS > 1`` (``tl.dot`` form) each
    K tile's product by its rows' factors of its segment of ``norm_seg_len`` columns (:func:`_tile_product`).
    ``RESIDUAL``: ``y`` is a residual stream updated in place, ``y = round(y + round(acc))``, with each row
    block's sum of squares of the new rows stored to ``out_parts[m, j]`` and (``SCALED``) ``scaled = round(y *
    scale)``: a following ``NORM`` launch on ``scaled`` computes ``RMSNorm(y) @ w.T`` (module docstring).
    ``CONV``: the first ``C_CONV`` output columns go through one step of a depthwise causal conv whose state is
    advanced in place (:func:`_conv_step_columns`). ``TMA``: the
    ``tl.dot`` form's tiles come through the tensor descriptors ``w_desc`` (``[N, K]``, block ``[BLOCK_N,
    BLOCK_K]``) and ``x_desc`` (``[M, K]``, block ``[M_PAD, BLOCK_K]``); the hardware
    zero-fills what lies past N, M or K, so no clamp and no mask (``x_ptr`` / ``w_ptr`` are then unused, and
    without ``TMA`` the descriptors are). ``TREE_CONV`` (one split, every row in this program): after the store,
    the first ``C_CONV`` columns go through the tree-window conv of a tree step (:func:`_tree_conv_columns`,
    ``TC_NODES`` nodes per request), written to ``tc_out``."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = tl.arange(0, M_PAD)  # [M_PAD]
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N] output columns = rows of w
    ks = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    k_begin = pid_k * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, K)
    if PDL and EARLY_TRIGGER:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()  # from here on the previous kernel's writes are visible
    elif PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    if TREE_CONV:  # the rows' trees, the conv weights and the committed-state taps, loaded while the weight streams
        tc_req, tc_real, tc_parent, tc_w, tc_state = _tree_conv_rows(
            rows, cols, M, TC_NODES, C_CONV, slots_ptr, tc_num_nodes_ptr, tc_parents_ptr, s_tc_pb, conv_w_ptr,
            conv_pool_ptr, M_PAD, BLOCK_N, CONV_WIDTH, CONV_WP)
    seg_rstd = tl.zeros([M_PAD, SPLIT_SEGMENTS], dtype=tl.float32)  # [M_PAD, SPLIT_SEGMENTS] (unused unless NORM)
    if NORM:  # fixed-order sums of the producer's parts: the same factors in every program; per segment: the
        # factors of the split's segments, all loaded before the loop
        seg_rstd = _segment_rstd(norm_parts_ptr, rows, M, k_begin // norm_seg_len, norm_seg_len, eps, N_NORM_PARTS,
                                 NORM_SEGMENTS, NORM_PARTS_PAD, SPLIT_SEGMENTS)
    if USE_DOT and TMA:
        acc = tl.zeros([M_PAD, BLOCK_N], dtype=tl.float32)  # [M_PAD, BLOCK_N]
        n0 = pid_n * BLOCK_N
        for k0 in range(k_begin, k_end, BLOCK_K):
            w = w_desc.load([n0, k0])  # [BLOCK_N, BLOCK_K]
            x = x_desc.load([0, k0])  # [M_PAD, BLOCK_K]
            acc = _tile_product(acc, x, w, seg_rstd, k0 // norm_seg_len - k_begin // norm_seg_len, IEEE,
                                NORM and NORM_SEGMENTS > 1, SPLIT_SEGMENTS)  # [M_PAD, BLOCK_N]
    elif USE_DOT:
        x_rows = x_ptr + rows[:, None] * s_xm  # [M_PAD, 1]
        w_rows = w_ptr + tl.minimum(cols, N - 1).to(tl.int64)[:, None] * K  # [BLOCK_N, 1] clamped: in bounds
        x_ok = (rows < M)[:, None]  # [M_PAD, 1] padding rows are not read
        acc = tl.zeros([M_PAD, BLOCK_N], dtype=tl.float32)  # [M_PAD, BLOCK_N]
        for k0 in range(k_begin, k_end, BLOCK_K):
            k_idx = (k0 + ks)[None, :]  # [1, BLOCK_K]
            if EVEN_K:
                w = tl.load(w_rows + k_idx)  # [BLOCK_N, BLOCK_K]
                x = tl.load(x_rows + k_idx, mask=x_ok, other=0.0)  # [M_PAD, BLOCK_K]
            else:
                w = tl.load(w_rows + k_idx, mask=k_idx < K, other=0.0)  # [BLOCK_N, BLOCK_K]
                x = tl.load(x_rows + k_idx, mask=x_ok & (k_idx < K), other=0.0)  # [M_PAD, BLOCK_K]
            acc = _tile_product(acc, x, w, seg_rstd, k0 // norm_seg_len - k_begin // norm_seg_len, IEEE,
                                NORM and NORM_SEGMENTS > 1, SPLIT_SEGMENTS)  # [M_PAD, BLOCK_N]
    else:  # elementwise fp32 products summed over the K loop, one reduction over k at the end
        # x's pointers are broadcast over the block's n (stride 0) so that its load gets w's register layout
        x_rows = x_ptr + rows[:, None, None] * s_xm + 0 * cols[None, :, None]  # [M_PAD, BLOCK_N, 1]
        w_rows = w_ptr + tl.minimum(cols, N - 1).to(tl.int64)[None, :, None] * K  # [1, BLOCK_N, 1] clamped
        x_ok = (rows < M)[:, None, None]  # [M_PAD, 1, 1]
        acc3 = tl.zeros([M_PAD, BLOCK_N, BLOCK_K], dtype=tl.float32)  # [M_PAD, BLOCK_N, BLOCK_K]
        for k0 in range(k_begin, k_end, BLOCK_K):
            k_idx = (k0 + ks)[None, None, :]  # [1, 1, BLOCK_K]
            if EVEN_K:
                w = tl.load(w_rows + k_idx)  # [1, BLOCK_N, BLOCK_K]
                x = tl.load(x_rows + k_idx, mask=x_ok, other=0.0)  # [M_PAD, BLOCK_N, BLOCK_K]
            else:
                w = tl.load(w_rows + k_idx, mask=k_idx < K, other=0.0)  # [1, BLOCK_N, BLOCK_K]
                x = tl.load(x_rows + k_idx, mask=x_ok & (k_idx < K), other=0.0)  # [M_PAD, BLOCK_N, BLOCK_K]
            acc3 += x.to(tl.float32) * w.to(tl.float32)  # [M_PAD, BLOCK_N, BLOCK_K]
        acc = tl.sum(acc3, axis=2)  # [M_PAD, BLOCK_N]
    if NORM and NORM_SEGMENTS == 1:
        acc = acc * tl.sum(seg_rstd, axis=1)[:, None]  # [M_PAD, BLOCK_N] (split-K: each partial; the sum is linear)
    if CONV:  # one split only (the host checks): the block's final product, as y would hold it
        acc = _conv_step_columns(acc.to(y_ptr.dtype.element_ty).to(tl.float32), rows, cols, M, slots_ptr,
                                 conv_w_ptr, conv_pool_ptr, C_CONV, CONV_WIDTH, CONV_RP, CONV_SILU)
    out_ok = (rows < M)[:, None] & (cols < N)[None, :]  # [M_PAD, BLOCK_N]
    y_ptrs = y_ptr + rows[:, None] * s_ym + cols[None, :]  # [M_PAD, BLOCK_N]
    if SPLIT_K == 1 and SWIGLU:
        _store_swiglu(acc, y_ptr, s_ym, rows, pid_n, M, N, M_PAD, BLOCK_N)
    elif SPLIT_K == 1:
        _store_y(acc, y_ptrs, out_ok, rows, cols, M, N, pid_n, out_parts_ptr, N_OUT_PARTS, scale_ptr, scaled_ptr,
                 RESIDUAL, SCALED)
        if TREE_CONV:
            if pid_n * BLOCK_N < C_CONV:
                _tree_conv_columns(acc.to(y_ptr.dtype.element_ty).to(tl.float32), rows, cols, M, TC_NODES, C_CONV,
                                   tc_req, tc_real, tc_parent, tc_w, tc_state, tc_out_ptr, M_PAD, BLOCK_N,
                                   CONV_WIDTH, CONV_WP, CONV_SILU)
    else:
        part_ptrs = part_ptr + rows[:, None] * N + cols[None, :]  # [M_PAD, BLOCK_N] in partials[0]
        tl.store(part_ptrs + pid_k * M * N, acc, mask=out_ok)
        tl.debug_barrier()  # every thread's partial is stored before the (one-thread) release below
        arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:  # the last split of this row block: every partial is visible
            total = tl.load(part_ptrs, mask=out_ok, other=0.0, cache_modifier=".cg")  # [M_PAD, BLOCK_N]
            for s in tl.static_range(1, SPLIT_K):  # fixed order: bit-identical whichever split arrived last;
                # unrolled, so the loads of all partials are independent and in flight together
                total += tl.load(part_ptrs + s * M * N, mask=out_ok, other=0.0, cache_modifier=".cg")
            if SWIGLU:
                _store_swiglu(total, y_ptr, s_ym, rows, pid_n, M, N, M_PAD, BLOCK_N)
            else:
                _store_y(total, y_ptrs, out_ok, rows, cols, M, N, pid_n, out_parts_ptr, N_OUT_PARTS, scale_ptr,
                         scaled_ptr, RESIDUAL, SCALED)
            tl.atomic_xchg(count_ptr + pid_n, 0, sem="relaxed", scope="gpu")  # ready for the next launch / replay


# ------------------------------------------------------------------------------------------------------ host side
_SCRATCH: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def split_k_scratch(device: torch.device, M: int, N: int, block_n: int, split_k: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The cached ``(partials [split_k, M, N] fp32, counters [cdiv(N, block_n)] int32)`` of one launch shape;
    counters start at zero and every launch leaves them at zero."""
    device = torch.device(device)
    key = (device.type, device.index, M, N, block_n, split_k)
    if key not in _SCRATCH:
        partials = torch.empty((split_k, M, N), dtype=torch.float32, device=device)  # [S, M, N]
        counters = torch.zeros((triton.cdiv(N, block_n),), dtype=torch.int32, device=device)  # [row blocks]
        _SCRATCH[key] = (partials, counters)
    return _SCRATCH[key]


def gemv_config(M: int, N: int, K: int, device: torch.device | str) -> GemvConfig:
    """Default launch for ``x: [M, K] @ w[N, K].T``: the best of the H200 sweep of 2026-12-01 (``bench/gemv.py``,
    bf16, the bench model's projections; ``bench/results/2026-12-01-h200-gemv.json``), by output width:

    - M = 1: broadcast + ``tl.sum``, 4 warps, 1 stage: ``[8, 512]`` tiles for N >= 65536 (the LM head: 140 against
      155 us); the rest from the sweep of the fused forms the decode step runs (``bench/decode_probe.py --what
      sweep``, same card, 2026-12-01): ``[4, 1024]`` unsplit for N <= 4096 and K <= 4096 (``[2048, 4096]`` adding
      into the residual: 6.8 against 8.3 us for the first rule's ``[4, 512]`` split in 3), ``[4, 512]`` split in 4
      above (the SwiGLU down projection ``[2048, 5632]``: 11.1 against 11.6 us), ``[32, 256]`` at 8 warps in between
      (``[11264, 2048]`` with the norm factor: 13.5 against 14.5 us for ``[16, 256]``);
    - M = 2..8: ``tl.dot`` on ``[64, 128]`` tiles, 4 warps, 4 stages, K split in 8 for N <= 4096 and ``[64, 128]``
      for N >= 65536, ``[32, 128]`` unsplit in between (ties with cuBLAS there);
    - M = 9..64 (``--rows 16 32 64``, same day): for N >= :data:`WIDE_N` ``[128, 128]`` tiles at 3 stages up to 32
      rows, ``[64, 64]`` at 5 stages above (LM head 145-162 against cuBLAS's 160-187 us); else (``--rows 64
      --row-sweep --pdl``, 2026-12-01, seventh session, with the unrolled split-K reduction) ``[64, 128]`` at 4
      warps, 4 stages, K split in 4 for N <= 4096 (``[2048, 4096]`` 9.1 against cuBLAS's 10.3 us, ``[2048, 5632]``
      10.6 against 12.0) and ``[64, 64]`` unsplit at 5 stages above (0.92-1.03x cuBLAS).

    ``split_k`` is reduced to whole, non-empty K tiles; the tile's K to the problem's below 512 columns.
    """
    device = torch.device(device)
    warps, use_dot = 4, True
    if M <= 1:
        use_dot, num_stages = False, 1
        if N <= 4096:
            block_n, block_k, split_k = (4, 1024, 1) if K <= 4096 else (4, 512, 4)
        elif N >= WIDE_N:
            block_n, block_k, split_k = 8, 512, 1
        else:
            (block_n, block_k, split_k), warps = (32, 256, 1), 8
    elif M <= MAX_SUM_ROWS:
        num_stages = 4
        block_n, block_k, split_k = (64, 128, 8) if N <= 4096 else (64, 128, 1) if N >= WIDE_N else (32, 128, 1)
    elif N >= WIDE_N:  # 9..64 rows (tree steps, batched decode)
        (block_n, block_k, num_stages), split_k = ((128, 128, 3) if M <= 32 else (64, 64, 5)), 1
    elif N <= 4096:
        block_n, block_k, num_stages, split_k = 64, 128, 4, 4
    else:
        block_n, block_k, num_stages, split_k = 64, 64, 5, 1
    block_k = min(block_k, max(16, triton.next_power_of_2(K)))
    split_k, _ = _split_k_range(K, block_k, split_k)
    return GemvConfig(block_n, block_k, split_k, warps, num_stages, use_dot)


def interleave_gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's weights ``gate, up: [I, K]`` as one ``[2I, K]`` weight with rows ``2j = gate_j``, ``2j + 1 = up_j``
    (the layout ``swiglu=True`` reads; ``x @ w.T`` then holds the pairs side by side)."""
    if not (isinstance(gate, torch.Tensor) and isinstance(up, torch.Tensor)) or gate.ndim != 2 \
            or gate.shape != up.shape:
        raise ValueError("gate and up must be tensors of one shape [I, K]")
    return torch.stack([gate, up], dim=1).reshape(2 * gate.shape[0], gate.shape[1]).contiguous()  # [2I, K]


def preferred(M: int, N: int) -> bool:
    """Whether a model step with ``M`` token rows should run its ``N``-output projections here rather than on
    cuBLAS: every shape up to :data:`MAX_ROWS` rows. Up to 8 rows (decode) every bench shape measured at least as
    fast as cuBLAS (``bench/gemv.py``); from 9 to 64 rows (tree steps) single projections range from 0.87x
    (``[9216, 2048]``) to 1.16x cuBLAS, and whole tree steps are faster because the residual add + RMSNorm and the
    tree conv then live in the GEMVs (H200, ``bench/model_verify.py --gemv-rows``, 2026-12-01, seventh session:
    verify N = 16 / 32 / 64 at B = 1 in 1700 / 1971 / 2089 us against 1886 / 2025 / 2254 with cuBLAS)."""
    return 1 <= M <= MAX_ROWS and N >= 1


def _split_k_range(K: int, block_k: int, split_k: int) -> tuple[int, int]:
    """``(splits, K per split)``: at most ``split_k`` K-ranges of whole ``block_k`` tiles, none of them empty."""
    k_tiles = triton.cdiv(K, block_k)
    tiles_per_split = triton.cdiv(k_tiles, max(1, min(split_k, k_tiles)))
    return triton.cdiv(k_tiles, tiles_per_split), tiles_per_split * block_k


def _is_pow2(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1 and v & (v - 1) == 0


def _check_config(config: object) -> GemvConfig:
    if not isinstance(config, GemvConfig):
        raise TypeError(f"config must be a GemvConfig or None, got {type(config).__name__}")
    for name in ("block_n", "block_k", "num_warps"):
        if not _is_pow2(getattr(config, name)):
            raise ValueError(f"config.{name} = {getattr(config, name)!r} must be a power of two")
    for name in ("split_k", "num_stages"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"config.{name} = {value!r} must be a positive int")
    if config.num_warps > 32:
        raise ValueError(f"config.num_warps = {config.num_warps} must be at most 32")
    if config.use_dot and (config.block_n < 16 or config.block_k < 16):
        raise ValueError(f"config.use_dot needs block_n, block_k >= 16, got {config.block_n}, {config.block_k}")
    if config.tma and not config.use_dot:
        raise ValueError("config.tma needs config.use_dot (the descriptors feed the tl.dot form)")
    if config.tma and max(config.block_n, config.block_k) > 256:
        raise ValueError(f"config.tma: a descriptor block is at most 256 per dimension, got {config.block_n} x "
                         f"{config.block_k}")
    return config


def _check_form(config: GemvConfig, M: int) -> None:
    if not config.use_dot and M > MAX_SUM_ROWS:
        raise ValueError(f"x has {M} rows: the broadcast + sum form (config.use_dot=False) takes at most "
                         f"{MAX_SUM_ROWS}; use a tl.dot config")


def small_batch_linear(x: torch.Tensor, w: torch.Tensor, *, out_dtype: torch.dtype | None = None,
                       config: GemvConfig | None = None, pdl: bool = False, swiglu: bool = False,
                       norm: RowNorm | None = None, conv: ConvStep | TreeConv | None = None, validate: bool = True,
                       out: torch.Tensor | None = None) -> torch.Tensor:
    """``y = x @ w.T`` for a few rows: ``x: [M, K]`` (1 <= M <= 64, contiguous last dim), ``w: [N, K]`` contiguous,
    same float dtype and device; fp32 accumulation; returns ``y: [M, N]`` in ``out_dtype`` (None: x's dtype).
    ``config`` (a :class:`GemvConfig`) overrides :func:`gemv_config`'s default launch. ``pdl`` (GPUs of compute
    capability 9 or more; ignored elsewhere): a programmatic dependent launch, whose programs are resident and
    waiting when the previous kernel ends (:mod:`~lumotree.optimized.pdl`; -3 % on the decode step, H200).
    ``swiglu``: ``w: [2I, K]`` is SwiGLU's gate and up weights with their rows interleaved
    (:func:`interleave_gate_up`) and ``y: [M, I] = silu(x @ w_gate.T) * (x @ w_up.T)``, computed in the epilogue with
    the rounding of a plain GEMV followed by the SwiGLU kernel (one launch and one round trip less; no ``conv``).
    ``norm`` (a :class:`RowNorm`): ``y[m] = (x[m] @ w.T) rsqrt(sum(norm.parts[m]) / K + norm.eps)`` before the
    rounding; with ``x = round(h * g)`` and the parts of :func:`residual_linear` that is ``RMSNorm(h) @ w.T``.
    Per-segment parts ``[M, S, R]`` scale each segment's share of the product instead (:class:`RowNorm`).
    ``conv`` (a :class:`ConvStep`): the first ``C`` columns of ``y`` are then (as rounded) the input of one step of a
    depthwise causal conv, replaced by its output, its state advanced in place in the epilogue of the program that
    owns the columns (one launch less than the GEMV + :func:`~lumotree.optimized.gdn_decode.conv_step`, the same
    values); one K split. ``conv`` (a :class:`TreeConv`, rows = the nodes of a tree step): the first ``C`` columns
    of ``y`` are kept and also go through the tree-window conv into ``conv.out`` (one launch less than the GEMV +
    :func:`~lumotree.optimized.conv_tree.tree_conv`, the same values); one K split. ``validate``: check the slots'
    (and the trees') values (reads them to the host; off in graph capture).
    ``out``: a contiguous ``[M, N]`` (``swiglu``: ``[M, N / 2]``) tensor of the output dtype to write ``y`` into
    (returned)."""
    x, w, K, cfg, out_dtype = _check_linear(x, w, out_dtype, config)
    n_out = w.shape[0]
    if swiglu:
        if n_out % 2:
            raise ValueError(f"w has {n_out} rows: with swiglu it interleaves gate and up rows, an even number")
        if conv is not None:
            raise ValueError("swiglu and conv cannot be combined: the conv reads the plain product")
        n_out //= 2
    if norm is not None:
        cfg = _check_norm(norm, x.shape[0], K, cfg, config is None, x.device)
    if conv is not None:
        conv = _check_conv(conv, x.shape[0], w.shape[0], x.device, validate)
        cfg = cfg._replace(split_k=1)  # the conv needs the block's whole sum
    if out is None:
        y = torch.empty((x.shape[0], n_out), dtype=out_dtype or x.dtype, device=x.device)  # [M, N or N / 2]
    else:
        y = check_tensor("out", out, (x.shape[0], n_out), "M, N / 2 (swiglu)" if swiglu else "M, N",
                         (out_dtype or x.dtype,), x.device, contiguous=True)
        if y.untyped_storage().data_ptr() in (x.untyped_storage().data_ptr(), w.untyped_storage().data_ptr()):
            raise ValueError("out shares memory with x or w: the programs reading them would race with its stores")
    if isinstance(conv, TreeConv):
        if conv.out.dtype != y.dtype:
            raise TypeError(f"conv.out has dtype {conv.out.dtype}, expected y's {y.dtype}")
        if conv.out.untyped_storage().data_ptr() in (y.untyped_storage().data_ptr(), x.untyped_storage().data_ptr()):
            raise ValueError("conv.out shares memory with y or x: the conv reads them while it stores")
    _launch(x, w, y, cfg, pdl, swiglu, norm, None, None, conv)
    return y


def residual_linear(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor, *, scale: torch.Tensor | None = None,
                    norm: RowNorm | None = None, config: GemvConfig | None = None, pdl: bool = False
                    ) -> ResidualRows:
    """``residual += x @ w.T`` in place, for a few rows (``x: [M, K]``, ``w: [N, K]``, ``residual: [M, N]``
    contiguous, one dtype): ``residual = round(residual + round(x @ w.T))``, the rounding of a separate GEMV followed
    by an add in fp32. Returns :class:`ResidualRows`: the new rows' sums
    of squares in pieces and, with ``scale: [N]`` fp32 (an RMSNorm's weight), ``scaled = round(residual * scale)``;
    ``small_batch_linear(scaled, w2, norm=RowNorm(parts, eps))`` is then ``RMSNorm(residual) @ w2.T``: the residual
    add + RMSNorm between two projections costs no launch of its own (module docstring). ``norm``: the product
    scaled as in :func:`small_batch_linear` before the add."""
    x, w, K, cfg, _ = _check_linear(x, w, None, config)
    M, N = x.shape[0], w.shape[0]
    if norm is not None:
        cfg = _check_norm(norm, M, K, cfg, config is None, x.device)
    check_tensor("residual", residual, (M, N), "M, N", (x.dtype,), x.device, contiguous=True)
    if residual.untyped_storage().data_ptr() in (x.untyped_storage().data_ptr(), w.untyped_storage().data_ptr()):
        raise ValueError("residual shares memory with x or w: the programs reading them would race with its update")
    scaled = None
    if scale is not None:
        check_tensor("scale", scale, (N,), "N", (torch.float32,), x.device, contiguous=True)
        scaled = torch.empty_like(residual)  # [M, N]
    parts = torch.empty((M, triton.cdiv(N, cfg.block_n)), dtype=torch.float32, device=x.device)  # [M, R]
    if parts.shape[1] > MAX_NORM_PARTS:
        raise ValueError(f"w has {N} rows: {parts.shape[1]} row blocks of {cfg.block_n} exceed the {MAX_NORM_PARTS} "
                         "pieces a norm reads")
    _launch(x, w, residual, cfg, pdl, False, norm, parts, (scale, scaled) if scale is not None else None, None)
    return ResidualRows(parts, scaled)


def _check_linear(x, w, out_dtype, config) -> tuple[torch.Tensor, torch.Tensor, int, GemvConfig, object]:
    """The shared argument checks: ``(x, w, K, launch config, out_dtype)``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    device = x.device
    check_tensor("x", x, (None, None), "M, K", FLOAT_DTYPES, device)
    M, K = x.shape
    if not 1 <= M <= MAX_ROWS:
        raise ValueError(f"x has {M} rows; small_batch_linear takes 1 to {MAX_ROWS} (use a matmul for more)")
    if K < 1:
        raise ValueError("x has K = 0 columns")
    check_tensor("w", w, (None, K), "N, K", (x.dtype,), device, contiguous=True)
    N = w.shape[0]
    if N < 1:
        raise ValueError("w has N = 0 rows")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be one of None, bfloat16, float16, float32, got {out_dtype!r}")
    cfg = gemv_config(M, N, K, device) if config is None else _check_config(config)
    _check_form(cfg, M)
    return x, w, K, cfg, out_dtype


def _check_norm(norm: object, M: int, K: int, cfg: GemvConfig, default: bool, device: torch.device) -> GemvConfig:
    """Checks ``norm``; returns the launch config, whose K tiles a per-segment norm fits inside one segment when it
    is the ``default`` one (``block_k`` halved until it divides the segment)."""
    if not isinstance(norm, RowNorm):
        raise TypeError(f"norm must be a RowNorm or None, got {type(norm).__name__}")
    segmented = isinstance(norm.parts, torch.Tensor) and norm.parts.ndim == 3
    shape, names = ((M, None, None), "M, S, R") if segmented else ((M, None), "M, R")
    parts = check_tensor("norm.parts", norm.parts, shape, names, (torch.float32,), device, contiguous=True)
    if not 1 <= parts.shape[-1] <= MAX_NORM_PARTS:
        raise ValueError(f"norm.parts has {parts.shape[-1]} pieces per row, expected 1 to {MAX_NORM_PARTS}")
    if segmented:
        S = parts.shape[1]
        if S < 1 or K % S:
            raise ValueError(f"norm.parts has S = {S} segments, which do not divide x's K = {K} columns")
        seg = K // S
        if default:
            block_k = cfg.block_k
            while seg % block_k and block_k > 16:
                block_k //= 2
            cfg = cfg._replace(block_k=block_k, num_warps=SEGMENT_NORM_WARPS or (8 if M > 32 else cfg.num_warps))
        if not cfg.use_dot or seg % cfg.block_k:
            raise ValueError(f"a per-segment norm (segments of {seg} columns) needs the tl.dot form with K tiles "
                             f"inside one segment; config has use_dot={cfg.use_dot}, block_k={cfg.block_k}")
    if isinstance(norm.eps, bool) or not isinstance(norm.eps, (int, float)) or not norm.eps > 0:
        raise ValueError(f"norm.eps = {norm.eps!r} must be a positive number")
    return cfg


def _check_conv(conv: object, M: int, N: int, device: torch.device, validate: bool) -> ConvStep | TreeConv:
    if isinstance(conv, TreeConv):
        return _check_tree_conv(conv, M, N, device, validate)
    if not isinstance(conv, ConvStep):
        raise TypeError(f"conv must be a ConvStep, a TreeConv or None, got {type(conv).__name__}")
    _check_conv_weights(conv, N, device, (torch.float32,))
    slots = check_slots(conv.slots, M, conv.state_pool.shape[0], device, validate, distinct=True)
    return conv._replace(slots=slots, silu=bool(conv.silu))


def _check_conv_weights(conv: ConvStep | TreeConv, N: int, device: torch.device, pool_dtypes: tuple) -> int:
    """The conv's ``weight: [C, W]`` (C within the N output columns, W >= 2) and ``state_pool: [P, W - 1, C]``;
    returns C."""
    check_tensor("conv.weight", conv.weight, (None, None), "C, W", FLOAT_DTYPES, device, contiguous=True)
    C, width = conv.weight.shape
    if not 1 <= C <= N:
        raise ValueError(f"conv.weight has C = {C} channels; the conv takes the first 1 to N = {N} output columns")
    if width < 2:
        raise ValueError("conv.weight has W = 1 tap: a width-1 convolution keeps no state")
    check_tensor("conv.state_pool", conv.state_pool, (None, width - 1, C), "P, W - 1, C", pool_dtypes, device,
                 contiguous=True)
    return C


def _check_tree_conv(conv: TreeConv, M: int, N: int, device: torch.device, validate: bool) -> TreeConv:
    C = _check_conv_weights(conv, N, device, FLOAT_DTYPES)
    parents = check_tensor("conv.parents", conv.parents, (None, None), "B, nodes", (torch.int32,), device,
                           contiguous=True)
    B, nodes = parents.shape
    if B * nodes != M:
        raise ValueError(f"conv.parents is [{B}, {nodes}]: B * nodes = {B * nodes} must equal the {M} rows of x")
    check_tensor("conv.num_nodes", conv.num_nodes, (B,), "B", (torch.int32,), device, contiguous=True)
    slots = check_slots(conv.slots, B, conv.state_pool.shape[0], device, validate, distinct=False)
    check_tensor("conv.out", conv.out, (B, nodes, C), "B, nodes, C", FLOAT_DTYPES, device, contiguous=True)
    if validate:
        check_num_nodes(conv.num_nodes, B, nodes, device, True)
        check_tree_rows(parents, conv.num_nodes)
    return conv._replace(slots=slots, silu=bool(conv.silu))


def _launch(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, cfg: GemvConfig, pdl: bool, swiglu: bool,
            norm: RowNorm | None, out_parts: torch.Tensor | None, scaling: tuple | None,
            conv: ConvStep | TreeConv | None) -> None:
    """One launch of :func:`_gemv_kernel` writing ``y`` (``out_parts`` given: ``y`` is a residual stream, updated;
    ``scaling = (scale, scaled)``: also ``scaled = round(y * scale)``)."""
    device = x.device
    M, N = x.shape[0], w.shape[0]
    K = w.shape[1]
    split_k, k_per_split = _split_k_range(K, cfg.block_k, cfg.split_k)
    if split_k > 1:
        partials, counters = split_k_scratch(device, M, N, cfg.block_n, split_k)  # [S, M, N], [row blocks]
    else:
        partials, counters = y, y  # unused
    m_pad = max(16, triton.next_power_of_2(M)) if cfg.use_dot else triton.next_power_of_2(M)
    pdl = bool(pdl) and pdl_supported(device)
    opts = {} if interpreting() else {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    if pdl:
        opts["launch_pdl"] = True
    n_norm_parts = norm.parts.shape[-1] if norm is not None else 1
    norm_segments = norm.parts.shape[1] if norm is not None and norm.parts.ndim == 3 else 1
    x_desc, w_desc = _descriptors(x, w, cfg, m_pad) if cfg.tma and tma_possible(x, w) else (None, None)
    tree = isinstance(conv, TreeConv)
    grid = (triton.cdiv(N, cfg.block_n), split_k)
    _gemv_kernel[grid](
        x, w, x if x_desc is None else x_desc, w if w_desc is None else w_desc, y, partials, counters,
        norm.parts if norm is not None else y, out_parts if out_parts is not None else y,
        *(scaling if scaling is not None else (y, y)),
        M, N, K, x.stride(0), y.stride(0), k_per_split, split_k, float(norm.eps) if norm is not None else 1.0,
        n_norm_parts, K // norm_segments, out_parts.shape[1] if out_parts is not None else 1,
        *((conv.slots, conv.weight, conv.state_pool, conv.weight.shape[0]) if conv is not None else (y, y, y, 0)),
        *((conv.num_nodes, conv.parents, conv.parents.stride(0), conv.out, conv.parents.shape[1]) if tree
          else (y, y, 0, y, 1)),
        M_PAD=m_pad, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, EVEN_K=K % cfg.block_k == 0,
        USE_DOT=cfg.use_dot, TMA=x_desc is not None, IEEE=x.dtype == torch.float32, PDL=pdl,
        EARLY_TRIGGER=M <= EARLY_TRIGGER_MAX_ROWS if PDL_EARLY_TRIGGER is None else bool(PDL_EARLY_TRIGGER),
        SWIGLU=bool(swiglu),
        NORM=norm is not None, NORM_SEGMENTS=norm_segments,
        SPLIT_SEGMENTS=_split_segments(K, k_per_split, split_k, K // norm_segments),
        NORM_PARTS_PAD=triton.next_power_of_2(n_norm_parts), RESIDUAL=out_parts is not None, SCALED=scaling is not None,
        CONV=isinstance(conv, ConvStep), CONV_WIDTH=conv.weight.shape[1] if conv is not None else 2,
        CONV_RP=max(2, triton.next_power_of_2(conv.weight.shape[1] - 1)) if conv is not None else 2,
        CONV_WP=triton.next_power_of_2(conv.weight.shape[1]) if conv is not None else 2,
        CONV_SILU=conv is not None and conv.silu, TREE_CONV=tree, **opts,
    )  # fmt: skip


def _split_segments(K: int, k_per_split: int, split_k: int, seg_len: int) -> int:
    """The most segments of ``seg_len`` columns one K split touches, as a power of two."""
    touched = max((min((s + 1) * k_per_split, K) - 1) // seg_len - s * k_per_split // seg_len + 1
                  for s in range(split_k))
    return triton.next_power_of_2(touched)


def _descriptors(x: torch.Tensor, w: torch.Tensor, cfg: GemvConfig, m_pad: int) -> tuple:
    """Host-built tensor descriptors of ``x`` (block ``[m_pad, block_k]``) and ``w`` (``[block_n, block_k]``),
    zero padding past the edges."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return (TensorDescriptor.from_tensor(x, [m_pad, cfg.block_k]),
            TensorDescriptor.from_tensor(w, [cfg.block_n, cfg.block_k]))
