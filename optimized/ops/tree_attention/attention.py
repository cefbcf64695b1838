r"""Tree attention for the gated attention layers: a decode-style Triton kernel for a batch of draft trees.

Each request ``b`` owns a slot of the KV cache pool and a draft tree of ``N`` nodes. Its committed keys/values sit at
positions ``[0, L_b)`` of the slot, the tree's own keys/values at ``[L_b, L_b + N)`` (node ``j`` at ``L_b + j``, written
by :func:`prepare_qkv`). Query node ``i`` attends to

    every committed position ``p < L_b``   and   tree node ``j`` iff ``M[i, j] = 1`` (j an ancestor of i or i itself),

with RoPE at position ``L_b + depth(i)`` for queries and tree keys. The output is gated: ``o = softmax(q K^T * scale)
V * sigmoid(gate)``, the Qwen3-Next gated attention before ``o_proj``.

The kernel reads each committed K/V block once for all query rows of one KV head: the rows are the pairs
(node, query head of the GQA group), so a 64-node tree with 8 query heads per KV head is a 512-row query block split in
``BLOCK_M`` tiles that run next to each other over the same KV split (the KV tile comes from L2 after the first).
The committed range is split over ``num_splits`` programs (decode style); the last split also walks the tree's
own keys under the ancestor mask. Partial results ``(acc, m, l)`` are merged by a small combine kernel that also
applies the sigmoid gate; with one split the main kernel finishes the output itself.

Layouts (all tensors on one device):

- KV cache pool: ``k_cache, v_cache: [P, HKV, C, D]`` (slot, kv head, position, head dim), ``C`` = capacity per slot.
- ``q, gate: [B, N, HQ, D]`` (strided views are fine), ``slots, cache_lens: [B]`` int32.
- Tree: ``parents: [B, N]`` int32 -> :func:`tree_metadata` -> ``words: [B, N, ceil(N/32)]`` int32 ancestor bitsets
  (the layout of :func:`lumotree.reference.tree.ancestor_words`; bit ``j % 32`` of word ``j // 32``) and
  ``depth: [B, N]`` int32.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..checks import (check_cache_slots, check_finite, check_kv_cache, check_lens_fit, check_rank,
                      check_request_rows, check_slot_range, interpreting, num_sms)
from ..pdl import allow_dependents, pdl_supported, prefetch_l2
from ..tree_meta import WORD_BITS

__all__ = ["tree_attention", "AttentionLaunch", "choose_num_splits", "default_launch", "default_tree_slack"]

_LOG2E = 1.4426950408889634


class AttentionLaunch(NamedTuple):
    """Launch parameters of :func:`tree_attention` (None: the default, :func:`default_launch`): ``block_m`` query rows
    and ``block_n`` keys (16, 32 or 64) a tile, ``num_warps``, ``num_stages``, ``tree_slack`` (committed key tiles the
    last split gives up per tile of tree keys it walks; 0: an even split; default :func:`default_tree_slack`) and
    ``combine_block_d`` (columns per program of the split combine, a power of two; default up to 4096 / splits)."""

    block_m: int | None = None
    block_n: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    tree_slack: int | None = None
    combine_block_d: int | None = None


@triton.jit
def _attend_tile(q, k_ptrs, v_ptrs, load_mask, score_mask, m_i, l_i, acc, qk_scale,
                 MASKED: tl.constexpr, IEEE: tl.constexpr):
    """One online-softmax step of ``BLOCK_M`` query rows over one key tile: returns the updated ``(m, l, acc)``.

    ``k_ptrs, v_ptrs: [BLOCK_N, BLOCK_D]``; ``load_mask`` guards the loads, ``score_mask [BLOCK_M, BLOCK_N]`` hides
    scores when ``MASKED`` (a full tile of committed keys needs neither: every row sees every key)."""
    k = tl.load(k_ptrs, mask=load_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
    if IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))  # [BLOCK_M, BLOCK_N]
    s = s * qk_scale
    if MASKED:
        s = tl.where(score_mask, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
    else:
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_use = m_new
    p = tl.math.exp2(s - m_use[:, None])  # [BLOCK_M, BLOCK_N]
    alpha = tl.math.exp2(m_i - m_use)  # [BLOCK_M]
    v = tl.load(v_ptrs, mask=load_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if IEEE:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
    else:
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return m_new, l_i, acc


@triton.jit
def _tiles_per_split(L, node_hi, NUM_SPLITS, TREE_SLACK, BLOCK_N: tl.constexpr):
    """Committed key tiles per split of a row block that sees tree nodes ``[0, node_hi)`` (every split but the last
    takes this many of ``[0, L)``, the last the rest plus the tree's tiles; :func:`_tree_attn_kernel`)."""
    return tl.cdiv(tl.cdiv(L, BLOCK_N) + TREE_SLACK * tl.cdiv(node_hi, BLOCK_N), NUM_SPLITS)


@triton.jit
def _split_holds_keys(s, per, L, NUM_SPLITS, BLOCK_N: tl.constexpr):
    """Whether split ``s`` sees any key: its committed range starts before ``L``, or it is the last (the tree's
    keys). The kernel writes the partials of these splits only, and the combine reads only these."""
    return (s * per * BLOCK_N < L) | (s == NUM_SPLITS - 1)


@triton.jit
def _tree_attn_kernel(
    Q, KC, VC, Gate, Words, Slots, Lens, Out, PartAcc, PartML,
    sqb, sqn, sqh, sgb, sgn, sgh, sob, son, soh,
    skcp, skch, skcc, svcp, svch, svcc, swb, swn,
    spa_s, spa_b, spa_n, spa_h, spm_s, spm_b, spm_n, spm_h,
    N, NW, HQ, D, qk_scale, NUM_SPLITS, TREE_SLACK,
    G: tl.constexpr, FINALIZE: tl.constexpr, HAS_GATE: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
    SKIP_EMPTY: tl.constexpr, PDL: tl.constexpr, KV_LINES: tl.constexpr, LINE_ELEMS: tl.constexpr,
):  # fmt: skip
    """Grid ``(row blocks, B * HKV, NUM_SPLITS)``. Rows are (node, query head in the GQA group) pairs. ``NW``: ancestor
    words per node. Split partials are stored normalised (``acc / l``) with ``(m, l)``.

    Work split: the committed range ``[0, L)`` is cut into ``Tc = cdiv(L, BLOCK_N)`` key tiles; every split but the
    last takes ``per = cdiv(Tc + TREE_SLACK * Tt, NUM_SPLITS)`` consecutive tiles, the last split the remaining ones
    plus the ``Tt`` tiles of the tree's own keys that this row block can see. ``TREE_SLACK`` (committed tiles the
    last split gives up per tree tile) takes the tree off the critical path; 0 is the even split. ``SKIP_EMPTY``
    (split partials only): a split without keys (:func:`_split_holds_keys`) stores nothing. ``PDL``: launched as a
    programmatic dependent launch (:mod:`~lumotree.optimized.ops.pdl`): the program prefetches its split's committed K
    and V rows into L2 (``KV_LINES`` lines of ``LINE_ELEMS`` elements per row) before it waits for the previous
    kernel (:func:`prepare_qkv`, which writes q and the tree's K / V, not the committed ones)."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    pid_s = tl.program_id(2)
    HKV = HQ // G
    b = (pid_bh // HKV).to(tl.int64)  # batch offsets (b * sqb) may pass 2^31
    kvh = pid_bh % HKV
    NODES: tl.constexpr = BLOCK_M // G  # nodes per row block
    offs_r = tl.arange(0, BLOCK_M)  # [BLOCK_M]
    node = pid_m * NODES + offs_r // G  # [BLOCK_M]
    head = kvh * G + offs_r % G  # [BLOCK_M]
    row_ok = (offs_r < NODES * G) & (node < N)
    offs_d = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    if EVEN_D:  # a mask constant along the contiguous dim keeps the loads 16 bytes wide
        mask_d = tl.full([BLOCK_D], 1, tl.int1)
    else:
        mask_d = offs_d < D
    offs_n = tl.arange(0, BLOCK_N)  # [BLOCK_N]

    slot = tl.load(Slots + b).to(tl.int64)
    L = tl.load(Lens + b)
    node_hi = tl.minimum((pid_m + 1) * NODES, N)  # this row block sees tree nodes [0, node_hi)
    per = _tiles_per_split(L, node_hi, NUM_SPLITS, TREE_SLACK, BLOCK_N)  # key tiles per split
    k_base = KC + slot * skcp + kvh * skch
    v_base = VC + slot * svcp + kvh * svch
    start = tl.minimum(pid_s * per * BLOCK_N, L)
    end = tl.minimum(start + per * BLOCK_N, L)
    if PDL:
        lines = tl.arange(0, KV_LINES) * LINE_ELEMS  # [KV_LINES] first element of each line of a row
        for t0 in range(start, end, BLOCK_N):
            rows_kv = tl.minimum(t0 + offs_n, end - 1).to(tl.int64)  # [BLOCK_N] (the last row again past the end)
            prefetch_l2(k_base + rows_kv[:, None] * skcc + lines[None, :])  # [BLOCK_N, KV_LINES]
            prefetch_l2(v_base + rows_kv[:, None] * svcc + lines[None, :])
        tl.extra.cuda.gdc_wait()  # from here on the previous kernel's writes (q, the tree's K / V) are visible
    q = tl.load(
        Q + b * sqb + node[:, None] * sqn + head[:, None] * sqh + offs_d[None, :],
        mask=row_ok[:, None] & mask_d[None, :], other=0.0,
    )  # [BLOCK_M, BLOCK_D]

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # committed keys: this split's tiles of [0, L) (NUM_SPLITS * per >= cdiv(L, BLOCK_N): the last split ends at L
    # and holds what the others leave); full tiles first, without masks
    full_end = start + tl.maximum(end - start, 0) // BLOCK_N * BLOCK_N
    pos = start + offs_n  # [BLOCK_N]
    k_ptrs = k_base + pos[:, None].to(tl.int64) * skcc + offs_d[None, :]  # [BLOCK_N, BLOCK_D]
    v_ptrs = v_base + pos[:, None].to(tl.int64) * svcc + offs_d[None, :]
    d_only = mask_d[None, :]  # [1, BLOCK_D]
    for _ in range(start, full_end, BLOCK_N):
        m_i, l_i, acc = _attend_tile(q, k_ptrs, v_ptrs, d_only, d_only, m_i, l_i, acc, qk_scale,
                                     MASKED=False, IEEE=IEEE)
        k_ptrs += BLOCK_N * skcc
        v_ptrs += BLOCK_N * svcc
    if full_end < end:  # the ragged last tile of the committed range
        kv_ok = (full_end + offs_n) < end  # [BLOCK_N]
        m_i, l_i, acc = _attend_tile(q, k_ptrs, v_ptrs, kv_ok[:, None] & d_only, kv_ok[None, :], m_i, l_i, acc,
                                     qk_scale, MASKED=True, IEEE=IEEE)

    # the tree's own keys (last split only): node j at position L + j, visible iff bit j of words[node]
    tree_end = tl.where(pid_s == NUM_SPLITS - 1, node_hi, 0)
    words_row = Words + b * swb + node * swn  # [BLOCK_M] each row's ancestor words
    for j0 in range(0, tree_end, BLOCK_N):
        j = j0 + offs_n  # [BLOCK_N]
        j_ok = j < node_hi
        pos = L + j
        # a tile of BLOCK_N <= 64 aligned keys spans words j0 // 32 and (BLOCK_N = 64) the next: two per row
        w0 = j0 // 32
        word_lo = tl.load(words_row + w0, mask=row_ok, other=0)  # [BLOCK_M]
        word_hi = tl.load(words_row + w0 + 1, mask=row_ok & (node * 0 + w0 + 1 < NW), other=0)  # [BLOCK_M]
        # [BLOCK_M, BLOCK_N] words[i][j // 32]
        word = tl.where((j // 32 == w0)[None, :], word_lo[:, None], word_hi[:, None])
        visible = ((word >> (j % 32)[None, :]) & 1) != 0
        m_i, l_i, acc = _attend_tile(
            q, k_base + pos[:, None].to(tl.int64) * skcc + offs_d[None, :],
            v_base + pos[:, None].to(tl.int64) * svcc + offs_d[None, :], j_ok[:, None] & d_only, visible,
            m_i, l_i, acc, qk_scale, MASKED=True, IEEE=IEEE)

    io_mask = row_ok[:, None] & mask_d[None, :]
    if SKIP_EMPTY:  # a split past the committed keys (not the last) stores nothing: the combine skips it (q is
        # loaded regardless: masking it on L would put the length's load before it; the flag as a vector: the
        # interpreter mistypes a scalar bool broadcast into a vector mask)
        row_ok = row_ok & _split_holds_keys(pid_s + 0 * offs_r, per, L, NUM_SPLITS, BLOCK_N)  # [BLOCK_M]
        io_mask = row_ok[:, None] & mask_d[None, :]
    if FINALIZE:  # one split: normalise and gate here
        o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # l == 0 only on padding rows
        if HAS_GATE:
            gate = tl.load(Gate + b * sgb + node[:, None] * sgn + head[:, None] * sgh + offs_d[None, :],
                           mask=io_mask, other=0.0).to(tl.float32)
            o = o * tl.sigmoid(gate)
        tl.store(Out + b * sob + node[:, None] * son + head[:, None] * soh + offs_d[None, :],
                 o.to(Out.dtype.element_ty), mask=io_mask)
    else:  # normalised partial
        part = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        split = pid_s.to(tl.int64)  # split offsets (pid_s * spa_s) may pass 2^31
        tl.store(PartAcc + split * spa_s + b * spa_b + node[:, None] * spa_n + head[:, None] * spa_h + offs_d[None, :],
                 part, mask=io_mask)
        ml = PartML + split * spm_s + b * spm_b + node * spm_n + head * spm_h
        tl.store(ml, m_i, mask=row_ok)
        tl.store(ml + 1, l_i, mask=row_ok)


@triton.jit
def _combine_kernel(
    PartAcc, PartML, Gate, Out, Lens,
    spa_s, spa_b, spa_n, spa_h, spm_s, spm_b, spm_n, spm_h, sgb, sgn, sgh, sob, son, soh,
    N, HQ, D, NUM_SPLITS, TREE_SLACK, NODES,
    HAS_GATE: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, KEY_BLOCK: tl.constexpr,
    SKIP_EMPTY: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """Grid ``(B * N * HQ, D / BLOCK_D)``: one (request, node, query head) row and ``BLOCK_D`` of its columns per
    program. ``o = sum_s w_s o_s / sum_s w_s`` with ``w_s = l_s 2^(m_s - max m)`` over the normalised split partials
    ``o_s``, ``BLOCK_S`` splits per vector load (one round trip when ``BLOCK_S >= NUM_SPLITS``); then the gate.
    ``SKIP_EMPTY``: only the splits that saw keys are read (:func:`_split_holds_keys`, from the main kernel's
    ``KEY_BLOCK`` key tiles and ``NODES`` nodes per row block): less to read, one dependent load (the length)
    before the partials."""
    allow_dependents(PDL)  # the output projection's GEMV may launch now (ops.pdl)
    pid = tl.program_id(0)
    h = pid % HQ
    n = (pid // HQ) % N
    b = (pid // (HQ * N)).to(tl.int64)  # batch and split offsets may pass 2^31
    if SKIP_EMPTY:
        L = tl.load(Lens + b)
        per = _tiles_per_split(L, tl.minimum((n // NODES + 1) * NODES, N), NUM_SPLITS, TREE_SLACK, KEY_BLOCK)
    offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)  # [BLOCK_D]
    mask_d = offs_d < D
    offs_s = tl.arange(0, BLOCK_S)  # [BLOCK_S]
    m_run = tl.full([1], float("-inf"), tl.float32)  # [1]
    w_run = tl.zeros([1], tl.float32)  # [1] sum of weights so far (scaled by 2^-m_run)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for s0 in range(0, NUM_SPLITS, BLOCK_S):
        s = s0 + offs_s  # [BLOCK_S]
        s_ok = s < NUM_SPLITS
        if SKIP_EMPTY:
            s_ok = s_ok & _split_holds_keys(s, per, L, NUM_SPLITS, KEY_BLOCK)
        ml = PartML + s.to(tl.int64) * spm_s + b * spm_b + n * spm_n + h * spm_h
        m_s = tl.load(ml, mask=s_ok, other=float("-inf"))  # [BLOCK_S] (-inf: a split that saw no key)
        l_s = tl.load(ml + 1, mask=s_ok, other=0.0)
        o_s = tl.load(PartAcc + s[:, None].to(tl.int64) * spa_s + b * spa_b + n * spa_n + h * spa_h + offs_d[None, :],
                      mask=s_ok[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_S, BLOCK_D]
        m_new = tl.maximum(m_run, tl.max(m_s, axis=0))  # [1]
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        scale_old = tl.math.exp2(m_run - m_use)  # [1]
        w_s = l_s * tl.math.exp2(m_s - m_use)  # [BLOCK_S]
        w_run = w_run * scale_old + tl.sum(w_s, axis=0)
        acc = acc * scale_old + tl.sum(o_s * w_s[:, None], axis=0)
        m_run = m_new
    o = acc / w_run
    if HAS_GATE:
        gate = tl.load(Gate + b * sgb + n * sgn + h * sgh + offs_d, mask=mask_d, other=0.0).to(tl.float32)
        o = o * tl.sigmoid(gate)
    tl.store(Out + b * sob + n * son + h * soh + offs_d, o.to(Out.dtype.element_ty), mask=mask_d)


def _default_blocks(G: int, N: int, D: int, dtype: torch.dtype = torch.bfloat16) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) of the main kernel, from H200 sweeps: decode
    (one node) 16-row x 32-key tiles with 4 stages (no register spills, two CTAs per SM), trees up to 128 rows 64 x
    32, larger trees 128 x 32 with 3 stages (the 128 x 64 tile spills registers and lost at B = 1, 16, 64)."""
    rows = G * N
    if rows <= 16:
        cfg = (16, 32, 4, 4)
    elif rows <= 128:
        cfg = (64, 32, 4, 3)
    else:
        cfg = (128, 32, 8, 3)
    block_m = max(cfg[0], triton.next_power_of_2(G))
    if dtype == torch.float32:  # fp32 tiles are twice as large: keep shared memory in bounds
        return min(block_m, max(64, triton.next_power_of_2(G))), 32, cfg[2], 2
    return block_m, cfg[1], cfg[2], cfg[3]


def choose_num_splits(batch: int, num_kv_heads: int, row_blocks: int, max_len: int, device: torch.device,
                      *, block_n: int = 64, waves: float = 1.0, min_chunk: int = 256) -> int:
    """Splits over the committed length so that at most ``waves`` waves of programs fill the GPU (rounded down: a
    partial extra wave would double the time of the split that lands in it), each split at least ``min_chunk`` keys
    long. Pass the cache capacity as ``max_len`` for CUDA graphs (the grid is fixed; the chunk length follows the
    current lengths)."""
    programs = batch * num_kv_heads * row_blocks
    want = math.floor(waves * num_sms(device) / max(programs, 1))
    cap = max(1, math.ceil(max_len / max(min_chunk, block_n)))
    return int(max(1, min(want, cap, 128)))


def default_launch(batch: int, num_nodes: int, num_heads: int, num_kv_heads: int, head_dim: int, max_len: int,
                   device: torch.device, dtype: torch.dtype = torch.bfloat16) -> tuple[int, int, int, int, int]:
    """The default ``(block_m, block_n, num_warps, num_stages, num_splits)`` of :func:`tree_attention`: splits fill
    one wave of programs (the sweep's best at B = 1, 16 and 64), at least 128 keys each for decode-sized problems
    (one node), 256 for trees."""
    G = num_heads // num_kv_heads
    bm, bn, nw, ns = _default_blocks(G, num_nodes, head_dim, dtype)
    row_blocks = triton.cdiv(num_nodes, bm // G)
    decode = G * num_nodes <= 16
    splits = choose_num_splits(batch, num_kv_heads, row_blocks, max_len, device, block_n=bn,
                               min_chunk=128 if decode else 256)
    return bm, bn, nw, ns, splits


def default_tree_slack(batch: int, num_nodes: int, num_heads: int, num_kv_heads: int, head_dim: int,
                       num_splits: int) -> int:
    """The default ``tree_slack`` of :func:`tree_attention`: 2 when the committed keys are split (the last split,
    which also walks the tree's keys, gives up two committed tiles per tree tile), else 0. H200, cold KV: at every
    split point measured 1 and 2 beat the even split, by 0.4-2.1 us (B = 1, N = 64: 36.2 -> 35.6 us over 8k keys, 24.5
    -> 22.4 us over 1k)."""
    return 2 if num_splits > 1 else 0


def tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    cache_lens: torch.Tensor,
    words: torch.Tensor,
    *,
    gate: torch.Tensor | None = None,
    scale: float | None = None,
    num_splits: int | None = None,
    max_len: int | None = None,
    out: torch.Tensor | None = None,
    launch: AttentionLaunch | None = None,
    validate: bool = True,
    pdl: bool = False,
) -> torch.Tensor:
    """Gated tree attention for a batch of trees over a slot-addressed KV cache pool.

    ``q: [B, N, HQ, D]`` rotated queries (from :func:`prepare_qkv`); ``k_cache, v_cache: [P, HKV, C, D]`` holding
    request ``b``'s committed K/V at ``[0, cache_lens[b])`` of slot ``slots[b]`` and its tree's K/V right after;
    ``words: [B, N, ceil(N/32)]`` ancestor bitsets (:func:`tree_metadata`); ``gate: [B, N, HQ, D]`` or None.
    Returns ``o [B, N, HQ, D]`` (dtype of q): ``softmax_visible(q k^T * scale) v * sigmoid(gate)``.

    ``num_splits`` (default :func:`choose_num_splits` over ``max_len``, default the longest ``cache_lens``, one
    host sync) fixes the grid; pass both for CUDA graphs. ``validate`` checks values (slot range, lengths against
    the capacity, finiteness of q and gate) with device-to-host copies: switch it off inside graph capture.
    ``launch``: an :class:`AttentionLaunch` overriding the default launch (:func:`default_launch`). ``pdl``: a
    programmatic dependent
    launch where the device supports it (:mod:`~lumotree.optimized.ops.pdl`), which prefetches each split's committed
    K / V into L2 before it waits for the previous kernel; that kernel must not write ``slots``, ``cache_lens`` or
    the committed K / V (:func:`prepare_qkv`, which signals at its start for this, writes only the tree's).
    """
    if launch is None:
        launch = AttentionLaunch()
    if not isinstance(launch, AttentionLaunch):
        raise TypeError(f"launch must be an AttentionLaunch or None, got {type(launch).__name__}")
    block_m, block_n, num_warps, num_stages, tree_slack, combine_block_d = launch
    device = q.device
    float_types = (torch.float32, torch.bfloat16, torch.float16)
    check_rank("q", q, 4, float_types, device)
    B, N, HQ, D = q.shape
    if q.stride(-1) != 1:
        raise ValueError("q must have a contiguous last dimension")
    check_rank("k_cache", k_cache, 4, float_types, device)
    P, HKV, C, _ = k_cache.shape
    check_kv_cache(k_cache, v_cache, HKV, D, device)
    if HQ % HKV != 0:
        raise ValueError(f"q has HQ = {HQ} heads, not a multiple of the cache's HKV = {HKV} heads (GQA)")
    if q.dtype != k_cache.dtype:
        raise TypeError(f"q has dtype {q.dtype} but the cache holds {k_cache.dtype}")
    check_cache_slots(slots, cache_lens, B, device)
    W = (N + WORD_BITS - 1) // WORD_BITS
    check_rank("words", words, 3, (torch.int32,), device)
    if words.shape != (B, N, W) or words.stride(2) != 1:
        raise ValueError(f"words has shape {tuple(words.shape)}, expected [B, N, ceil(N/32)] = {(B, N, W)}")
    if gate is not None:
        check_rank("gate", gate, 4, float_types, device)
        if gate.shape != q.shape or gate.stride(-1) != 1:
            raise ValueError(f"gate has shape {tuple(gate.shape)}, expected {tuple(q.shape)} (contiguous last dim)")
    if scale is None:
        scale = D**-0.5
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale = {scale!r} must be a positive finite number")
    if validate:
        check_slot_range(slots, P)
        check_lens_fit(cache_lens, None, N, C)
        check_finite("q", q)
        if gate is not None:
            check_finite("gate", gate)
    G = HQ // HKV
    if num_splits is None and max_len is None:
        max_len = int(cache_lens.max().item()) if B else 0
    bm, bn, nw, ns, splits = default_launch(B, N, HQ, HKV, D, max_len or 0, device, q.dtype)
    custom_tiles = block_m is not None or block_n is not None
    block_m = block_m or bm
    block_n = block_n or bn
    if block_m < G or block_m & (block_m - 1):
        raise ValueError(f"block_m = {block_m} must be a power of two >= the GQA group size {G}")
    if block_n not in (16, 32, 64):
        raise ValueError(f"block_n = {block_n} must be 16, 32 or 64 (a key tile spans at most two ancestor words)")
    row_blocks = triton.cdiv(N, block_m // G)
    if num_splits is None:
        num_splits = splits if not custom_tiles else choose_num_splits(B, HKV, row_blocks, max_len, device,
                                                                       block_n=block_n)
    if not (isinstance(num_splits, int) and num_splits >= 1):
        raise ValueError(f"num_splits = {num_splits!r} must be a positive integer")
    if tree_slack is None:
        tree_slack = default_tree_slack(B, N, HQ, HKV, D, num_splits)
    if not (isinstance(tree_slack, int) and 0 <= tree_slack <= 1024):
        raise ValueError(f"tree_slack = {tree_slack!r} must be an integer in [0, 1024]")
    if combine_block_d is not None and not (isinstance(combine_block_d, int) and combine_block_d >= 16
                                            and combine_block_d & (combine_block_d - 1) == 0):
        raise ValueError(f"combine_block_d = {combine_block_d!r} must be a power of two >= 16")
    if out is None:
        out = torch.empty((B, N, HQ, D), dtype=q.dtype, device=device)  # [B, N, HQ, D]
    elif out.shape != (B, N, HQ, D) or out.stride(-1) != 1 or out.dtype != q.dtype:
        raise ValueError(f"out must be [B, N, HQ, D] = {(B, N, HQ, D)} of dtype {q.dtype}, contiguous last dim")
    for name, t in (("q", q), ("gate", gate), ("out", out)):
        if t is not None:
            check_request_rows(name, t)
    if num_splits > 1:
        part_acc = torch.empty((num_splits, B, N, HQ, D), dtype=torch.float32, device=device)  # [S, B, N, HQ, D]
        part_ml = torch.empty((num_splits, B, N, HQ, 2), dtype=torch.float32, device=device)  # [S, B, N, HQ, (m, l)]
    else:
        part_acc = part_ml = out  # unused
    g = gate if gate is not None else q
    block_d = max(16, triton.next_power_of_2(D))
    # tree-sized partials (more than a decode tile of rows per kv head): the splits without keys store and the
    # combine reads nothing (H200, B = 1, N = 64, L = 1024, 16 splits: -3.5 us a verify step); at decode sizes the
    # skip (its length loads ahead of q and of the partials) measured +2 us a decode step
    skip_empty = num_splits > 1 and G * N > 16
    pa_strides = part_acc.stride()[:4] if num_splits > 1 else (0, 0, 0, 0)
    pm_strides = part_ml.stride()[:4] if num_splits > 1 else (0, 0, 0, 0)
    extra = {}
    if num_warps or not interpreting():
        extra["num_warps"] = num_warps or nw
        extra["num_stages"] = num_stages or ns
    pdl = bool(pdl) and pdl_supported(device)
    if pdl:
        extra["launch_pdl"] = True
    line_elems = 128 // k_cache.element_size()  # elements of one 128-byte line
    _tree_attn_kernel[(row_blocks, B * HKV, num_splits)](
        q, k_cache, v_cache, g, words, slots, cache_lens, out, part_acc, part_ml,
        q.stride(0), q.stride(1), q.stride(2), g.stride(0), g.stride(1), g.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
        v_cache.stride(2), words.stride(0), words.stride(1), *pa_strides, *pm_strides,
        N, W, HQ, D, float(scale) * _LOG2E, num_splits, tree_slack,
        G=G, FINALIZE=num_splits == 1, HAS_GATE=gate is not None, IEEE=q.dtype == torch.float32,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, EVEN_D=block_d == D, SKIP_EMPTY=skip_empty, PDL=pdl,
        KV_LINES=triton.cdiv(D, line_elems), LINE_ELEMS=line_elems, **extra,
    )  # fmt: skip
    if num_splits > 1:
        block_s = min(128, triton.next_power_of_2(num_splits))  # all splits in one load up to 128
        block_dc = min(block_d, combine_block_d or max(16, 4096 // block_s))  # [block_s, block_dc] tiles
        _combine_kernel[(B * N * HQ, triton.cdiv(D, block_dc))](
            part_acc, part_ml, g, out, cache_lens, *pa_strides, *pm_strides, g.stride(0), g.stride(1), g.stride(2),
            out.stride(0), out.stride(1), out.stride(2), N, HQ, D, num_splits, tree_slack, block_m // G,
            HAS_GATE=gate is not None, BLOCK_D=block_dc, BLOCK_S=block_s, KEY_BLOCK=block_n, SKIP_EMPTY=skip_empty,
            PDL=pdl_supported(out.device),
            **({} if interpreting() else {"num_warps": 4}),
        )  # fmt: skip
    return out


