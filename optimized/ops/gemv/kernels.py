"""Small-batch linear layer ``y = x @ w.T`` for decode and small tree steps (M <= 64 token rows), streaming the
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
repeat that work ``BLOCK_N`` times). Parts ``[M, S, R]`` make the factor
one per segment of ``K / S`` columns (a head of a per-head norm such as the GDN layer's gated RMSNorm, whose other
half the verify kernel does: :class:`~lumotree.optimized.ops.gdn_tree.OutputGate`): each K tile's product is scaled by
its segment's factors, loaded for the split before the loop (``tl.dot`` form). ``conv=ConvStep(...)``: the first ``C``
output columns (the GDN layer's q | k | v) go through one decode step of the depthwise causal conv in the epilogue,
the conv state shifted in place by the program that owns those channels (no other program reads them; one K split,
since the conv needs the block's whole sum): bit-identical to the GEMV followed by
:func:`~lumotree.optimized.ops.gdn_decode.conv_step`.

In a tree step (``TreeConv``, rows = the step's nodes, all in every program of the ``tl.dot`` form) the ``w_in``
projection's first ``C`` columns also go through the tree-window conv in the epilogue: each row's window is gathered
from the block's product in registers along the parents (gathered the same way) and, past the root, from the
committed conv state; ``y`` keeps the inputs (the commit's conv rows) and ``out`` gets ``act(conv)``, the values of
:func:`~lumotree.optimized.ops.conv_tree.tree_conv`. ``GemvConfig.tma`` fetches the ``tl.dot`` form's tiles through
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

__all__ = ["GemvConfig", "RowNorm", "ResidualRows", "ConvStep", "TreeConv", "MAX_ROWS", "MAX_SUM_ROWS",
           "MAX_NORM_PARTS", "WIDE_N", "OUT_DTYPES"]

MAX_ROWS = 64  # the largest M (token rows) the kernel is built for
MAX_SUM_ROWS = 8  # the broadcast + sum form's limit (its registers grow with M)
WIDE_N = 65536  # outputs at least this wide (LM heads): the default launch beat cuBLAS up to MAX_ROWS rows
OUT_DTYPES = (None, torch.bfloat16, torch.float16, torch.float32)


MAX_NORM_PARTS = 4096  # the most pieces of a row's sum of squares a norm prologue reads (one load per program)


class RowNorm(NamedTuple):
    """The per-row factor a GEMV applies to its product: row m times ``rsqrt(sum(parts[m]) / K + eps)``, with
    ``parts: [M, R]`` fp32 the rows' sums of squares in pieces (as :func:`residual_linear` leaves them) and
    ``eps > 0``. ``parts: [M, S, R]``: per segment instead, row m's ``s``-th segment of ``K / S`` columns (an
    attention or GDN head) times ``rsqrt(sum(parts[m, s]) / (K / S) + eps)``, applied to each K tile's product
    (the ``tl.dot`` form, tiles inside one segment: ``block_k`` divides ``K / S``): ``y = sum_s rstd[m, s]
    x[m, seg s] w[:, seg s]^T``, e.g. a gated RMSNorm per head whose ``x = round(w_norm o silu(z))`` and parts
    the fused GDN verify left (:class:`~lumotree.optimized.ops.gdn_tree.OutputGate`)."""

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
    conv (else none). Same math as :func:`~lumotree.optimized.ops.gdn_decode.conv_step`."""

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
    :func:`~lumotree.optimized.ops.conv_tree.tree_conv` on ``y[:, :C]`` (no bias)."""

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
                  SEG_BLOCK: tl.constexpr, wscale, FP8: tl.constexpr):
    """``acc + x w^T`` on the tensor cores (``IEEE``: fp32 FMA). ``SEGMENTED`` (a per-segment :class:`RowNorm`):
    the tile lies in the split's ``seg_off``-th segment, whose factors (column ``seg_off`` of the split's
    ``seg_rstd [M_PAD, SEG_BLOCK]``) scale its product. Measured slower on the H200: scaling the x tile instead,
    rounded to x's dtype, so that the accumulation stays on the tensor
    cores (the model's ``[2048, 4096]`` launch at 64 rows 12 -> 98 us), and two tiles' products formed before
    either is scaled (11.6 -> 14.0 us). ``FP8``: ``w`` holds float8_e4m3fn values (exact in x's dtype) and the
    tile's product is scaled by its rows' block scales ``wscale: [BLOCK_N]``
    (:mod:`~lumotree.optimized.ops.gemv.fp8`)."""
    if FP8:
        w = w.to(x.dtype)
        if IEEE:
            part = tl.dot(x, tl.trans(w), input_precision="ieee") * wscale[None, :]  # [M_PAD, BLOCK_N]
        else:
            part = tl.dot(x, tl.trans(w)) * wscale[None, :]  # [M_PAD, BLOCK_N]
        if SEGMENTED:
            pick = tl.arange(0, SEG_BLOCK)[None, :] == seg_off  # [1, SEG_BLOCK]
            part = part * tl.sum(tl.where(pick, seg_rstd, 0.0), axis=1)[:, None]
        return acc + part
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
    program, so no other program reads it (:func:`~lumotree.optimized.ops.gdn_decode.conv_step`'s math)."""
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
    :func:`~lumotree.optimized.ops.conv_tree.tree_conv` (the walk gathers the parents of every row from one load, in
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
    :func:`~lumotree.optimized.ops.conv_tree.tree_conv`'s order (the same values); ``act(conv)`` is stored to
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
    TREE_CONV: tl.constexpr, ws_ptr, wr_ptr, n_kb, FP8: tl.constexpr, KSUB: tl.constexpr,
):  # fmt: skip
    """Program (row block j, split s): ``acc[m, n] = sum_{k in split s} x[m, k] w[n, k]`` over the block's n, then
    ``y = acc`` (one split) or the deterministic split-K reduction of the module docstring. ``PDL``: launched as a
    programmatic dependent launch (:mod:`~lumotree.optimized.ops.pdl`): the program waits for the previous kernel before
    it touches memory (``x`` and the output buffers may be its work) and lets the next kernel launch, before that
    wait with ``EARLY_TRIGGER`` (decode-sized launches: the next GEMVs sit resident early), after it otherwise (a
    chain of waiting tree-step GEMVs would hold the SMs; :data:`EARLY_TRIGGER_MAX_ROWS`). Prefetching the first
    weight tiles into L2 before the wait measured slower: not done.
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
    ``TC_NODES`` nodes per request), written to ``tc_out``. ``FP8``: ``w`` is float8_e4m3fn with block scales
    ``ws: [R, n_kb]`` and row indices ``wr: [N]`` (:mod:`~lumotree.optimized.ops.gemv.fp8`): the ``tl.dot`` form's
    tiles (``BLOCK_K`` <= 128) are scaled after their product, the broadcast form's ``[BLOCK_N, KSUB]`` sub-tiles
    (``KSUB = 128``, ``BLOCK_K / KSUB`` of them per iteration, all loads in flight together) before it."""
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
    if FP8:  # each weight row's scale row, as an offset into ws (rows past N clamped like the weight's)
        srow = tl.load(wr_ptr + tl.minimum(cols, N - 1)).to(tl.int64) * n_kb  # [BLOCK_N]
    else:
        srow = cols.to(tl.int64)  # unused
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
                                NORM and NORM_SEGMENTS > 1, SPLIT_SEGMENTS, srow, False)  # [M_PAD, BLOCK_N]
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
            wscale = tl.load(ws_ptr + srow + k0 // 128) if FP8 else srow  # [BLOCK_N] the tile's block scales
            acc = _tile_product(acc, x, w, seg_rstd, k0 // norm_seg_len - k_begin // norm_seg_len, IEEE,
                                NORM and NORM_SEGMENTS > 1, SPLIT_SEGMENTS, wscale, FP8)  # [M_PAD, BLOCK_N]
    else:  # elementwise fp32 products summed over the K loop, one reduction over k at the end
        # x's pointers are broadcast over the block's n (stride 0) so that its load gets w's register layout
        x_rows = x_ptr + rows[:, None, None] * s_xm + 0 * cols[None, :, None]  # [M_PAD, BLOCK_N, 1]
        w_rows = w_ptr + tl.minimum(cols, N - 1).to(tl.int64)[None, :, None] * K  # [1, BLOCK_N, 1] clamped
        x_ok = (rows < M)[:, None, None]  # [M_PAD, 1, 1]
        ksub = tl.arange(0, KSUB)  # [KSUB] (KSUB = BLOCK_K unless FP8)
        acc3 = tl.zeros([M_PAD, BLOCK_N, KSUB], dtype=tl.float32)  # [M_PAD, BLOCK_N, KSUB]
        for k0 in range(k_begin, k_end, BLOCK_K):
            for j in tl.static_range(BLOCK_K // KSUB):
                k_idx = (k0 + j * KSUB + ksub)[None, None, :]  # [1, 1, KSUB]
                if EVEN_K:
                    w = tl.load(w_rows + k_idx)  # [1, BLOCK_N, KSUB]
                    x = tl.load(x_rows + k_idx, mask=x_ok, other=0.0)  # [M_PAD, BLOCK_N, KSUB]
                else:
                    w = tl.load(w_rows + k_idx, mask=k_idx < K, other=0.0)  # [1, BLOCK_N, KSUB]
                    x = tl.load(x_rows + k_idx, mask=x_ok & (k_idx < K), other=0.0)  # [M_PAD, BLOCK_N, KSUB]
                wf = w.to(tl.float32)
                if FP8:  # the sub-tile's block scales (a sub-tile past K reads the last block's: its weights are 0)
                    wscale = tl.load(ws_ptr + srow + tl.minimum((k0 + j * KSUB) // 128, n_kb - 1))  # [BLOCK_N]
                    wf = wf * wscale[None, :, None]  # [1, BLOCK_N, KSUB]
                acc3 += x.to(tl.float32) * wf  # [M_PAD, BLOCK_N, KSUB]
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
