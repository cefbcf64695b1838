r"""Triton kernels of the routed MoE block (:mod:`~lumotree.optimized.ops.moe`); launches in
:mod:`~lumotree.optimized.ops.moe.routed`.

A step's ``T`` tokens each pick ``k`` experts: ``P = T k`` (token, expert) *pairs*, pair ``p = t k + j`` the token's
``j``-th choice. The kernels run them as a grouped GEMM over the experts that hold pairs:

1. ``_route_kernel`` (a block of ``BLOCK_T`` tokens a program): softmax of the router logits in fp32, the top ``k``
   by ``k`` rounds of max (ties: the lowest expert index), renormalised when asked, rounded to the input dtype (as
   transformers casts them); the block's count per expert and each pair's rank among the block's pairs of its expert.
   ``SINGLE`` (one block holds every token: decode and small tree steps): also the totals and the sorted order, so
   steps 2-3 do not run.
2. ``_scan_kernel`` (one program): per-expert totals and each (block, expert)'s first sorted position, the
   exclusive prefix over the experts and over the blocks before it.
3. ``_scatter_kernel``: ``sorted_pair[base[block, e] + rank] = p``, a stable counting sort of the pairs by expert.
4. ``_gate_up_kernel``: tile ``b`` of ``BLOCK_M`` sorted rows of one expert (found from the totals: expert ``e``
   owns ``cdiv(count_e, BLOCK_M)`` consecutive tiles; experts without pairs own none, so their weights are never
   read, and tiles past the last exit after reading the totals) times ``BLOCK_N`` gate rows and the matching up
   rows of ``w_gate_up[e]``; ``act = silu(g) u`` in fp32, stored rounded, in sorted order. The first
   ``SHARED_TILES`` tiles run the shared expert on the tokens in order.
5. ``_down_kernel``: the same tiles times ``w_down[e]``; each pair's row, scaled by its router weight, is stored at
   its pair index (the shared expert's rows at their token).
6. ``_combine_kernel``: ``out[t] = sum_j y[t k + j]`` in the fixed order ``j = 0 .. k - 1``, fp32, plus
   ``sigmoid(x_t . shared_gate) y_shared[t]``; one rounding.

Block-FP8 weights (``FP8`` for the experts, ``FP8_S`` for the shared expert, each kernel apart:
:class:`~lumotree.optimized.ops.gemv.Fp8Weight`): each e4m3 weight tile is converted to x's dtype in registers
(exact) and each K tile's fp32 product is multiplied by its output rows' scales ``scale[e, scale_rows[n], k0 // 128]``
before it joins the accumulator (``BLOCK_K`` divides 128: a tile lies in one scale block). When the experts and the
shared expert are of one kind, the tile's branch only picks the pointers and one copy of the loop runs (as the
float kernels always did); of two kinds, each branch runs its own copy.

No float atomics and no data-dependent shapes: every buffer and grid is sized from ``(T, k, E)``, so the block is
deterministic and a CUDA graph can capture it.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _dot(a, b, acc, IEEE: tl.constexpr):
    """``acc + a b`` (``IEEE``: fp32 FMA instead of tf32 for fp32 inputs)."""
    if IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def _route_kernel(logits_ptr, ids_ptr, weights_ptr, counts_ptr, rank_ptr, totals_ptr, sorted_pair_ptr, T, E,
                  TOP_K: tl.constexpr, NORM: tl.constexpr, SINGLE: tl.constexpr, BLOCK_T: tl.constexpr,
                  E_PAD: tl.constexpr, K_PAD: tl.constexpr):
    """Tokens ``block BLOCK_T ..`` of ``logits: [T, E]`` (the input dtype): ``ids, weights: [T, k]`` (int32, fp32
    holding the rounded weight), and ``counts[block, e]`` with ``rank[t, j]`` (the pair's place among the block's
    pairs of its expert, in pair order) or, ``SINGLE``, ``totals[e]`` with ``sorted_pair``."""
    block = tl.program_id(0)
    tokens = block * BLOCK_T + tl.arange(0, BLOCK_T)  # [BLOCK_T]
    experts = tl.arange(0, E_PAD)  # [E_PAD]
    slots = tl.arange(0, K_PAD)  # [K_PAD]
    ok_t = tokens < T
    ok_e = experts < E
    logits = tl.load(logits_ptr + tokens.to(tl.int64)[:, None] * E + experts[None, :],
                     mask=ok_t[:, None] & ok_e[None, :], other=0.0).to(tl.float32)  # [BLOCK_T, E_PAD]
    logits = tl.where(ok_e[None, :], logits, float("-inf"))
    p = tl.exp(logits - tl.max(logits, axis=1)[:, None])
    probs = p / tl.sum(p, axis=1)[:, None]  # [BLOCK_T, E_PAD], padded experts 0
    cand = tl.where(ok_e[None, :], probs, -1.0)  # padding below every probability; taken experts below that
    ids = tl.zeros([BLOCK_T, K_PAD], dtype=tl.int32)
    top = tl.zeros([BLOCK_T, K_PAD], dtype=tl.float32)
    picks = tl.zeros([BLOCK_T, E_PAD], dtype=tl.int32)  # times token t took expert e (0 or 1)
    for j in range(TOP_K):
        best = tl.max(cand, axis=1)  # [BLOCK_T]
        pick = tl.min(tl.where(cand == best[:, None], experts[None, :], E_PAD), axis=1)  # lowest index of the ties
        pick = tl.minimum(pick, E - 1)  # in range even for NaN logits (inputs not validated)
        taken = experts[None, :] == pick[:, None]  # [BLOCK_T, E_PAD]
        cand = tl.where(taken, -2.0, cand)
        picks += taken.to(tl.int32)
        ids = tl.where(slots[None, :] == j, pick[:, None], ids)
        top = tl.where(slots[None, :] == j, best[:, None], top)
    if NORM:
        top = top / tl.sum(top, axis=1)[:, None]
    top = top.to(logits_ptr.dtype.element_ty).to(tl.float32)  # transformers' cast to the logits' dtype
    pair_ok = ok_t[:, None] & (slots[None, :] < TOP_K)  # [BLOCK_T, K_PAD]
    pairs = tokens[:, None] * TOP_K + slots[None, :]  # [BLOCK_T, K_PAD]
    tl.store(ids_ptr + pairs, ids, mask=pair_ok)
    tl.store(weights_ptr + pairs, top, mask=pair_ok)
    picks = tl.where(ok_t[:, None], picks, 0)
    counts = tl.sum(picks, axis=0)  # [E_PAD]
    before = tl.cumsum(picks, axis=0) - picks  # [BLOCK_T, E_PAD] the block's earlier tokens' picks of e
    if SINGLE:
        tl.store(totals_ptr + experts, counts, mask=ok_e)
        before += (tl.cumsum(counts, axis=0) - counts)[None, :]  # + the expert's first sorted position
    else:
        tl.store(counts_ptr + block * E + experts, counts, mask=ok_e)
    for j in range(TOP_K):
        id_j = tl.sum(tl.where(slots[None, :] == j, ids, 0), axis=1)  # [BLOCK_T]
        taken = experts[None, :] == id_j[:, None]  # [BLOCK_T, E_PAD]
        place = tl.sum(tl.where(taken, before, 0), axis=1)  # [BLOCK_T]
        before += taken.to(tl.int32)  # a repeated pick (NaN logits only) gets the next place
        if SINGLE:
            tl.store(sorted_pair_ptr + place, tokens * TOP_K + j, mask=ok_t)
        else:
            tl.store(rank_ptr + tokens * TOP_K + j, place, mask=ok_t)


@triton.jit
def _scan_kernel(counts_ptr, base_ptr, totals_ptr, NB, E, BLOCK_NB: tl.constexpr, E_PAD: tl.constexpr):
    """``counts: [NB, E]`` per block -> ``totals: [E]`` and ``base[b, e] = sum_{e' < e} totals[e'] +
    sum_{b' < b} counts[b', e]`` (one program; two passes over the blocks)."""
    experts = tl.arange(0, E_PAD)  # [E_PAD]
    ok_e = experts < E
    rows = tl.arange(0, BLOCK_NB)  # [BLOCK_NB]
    totals = tl.zeros([E_PAD], dtype=tl.int32)
    for b0 in range(0, NB, BLOCK_NB):
        ok = ((b0 + rows) < NB)[:, None] & ok_e[None, :]
        totals += tl.sum(tl.load(counts_ptr + (b0 + rows)[:, None] * E + experts[None, :], mask=ok, other=0), axis=0)
    tl.store(totals_ptr + experts, totals, mask=ok_e)
    running = tl.cumsum(totals, axis=0) - totals  # [E_PAD] each expert's first sorted position
    for b0 in range(0, NB, BLOCK_NB):
        ok = ((b0 + rows) < NB)[:, None] & ok_e[None, :]
        offs = (b0 + rows)[:, None] * E + experts[None, :]  # [BLOCK_NB, E_PAD]
        c = tl.load(counts_ptr + offs, mask=ok, other=0)
        tl.store(base_ptr + offs, tl.cumsum(c, axis=0) - c + running[None, :], mask=ok)
        running += tl.sum(c, axis=0)


@triton.jit
def _scatter_kernel(ids_ptr, rank_ptr, base_ptr, sorted_pair_ptr, T, E, TOP_K: tl.constexpr, BLOCK_T: tl.constexpr):
    """``sorted_pair[base[block, ids[p]] + rank[p]] = p`` for the block's pairs ``p``."""
    block = tl.program_id(0)
    tokens = block * BLOCK_T + tl.arange(0, BLOCK_T)  # [BLOCK_T]
    ok = tokens < T
    for j in range(TOP_K):
        pair = tokens * TOP_K + j  # [BLOCK_T]
        expert = tl.load(ids_ptr + pair, mask=ok, other=0)
        place = tl.load(base_ptr + block * E + expert, mask=ok, other=0) + tl.load(rank_ptr + pair, mask=ok, other=0)
        tl.store(sorted_pair_ptr + place, pair, mask=ok)


@triton.jit
def _expert_tile(totals_ptr, tile, E, BLOCK_M: tl.constexpr, E_PAD: tl.constexpr):
    """``(e, start, end)``: routed tile ``tile`` covers sorted rows ``[start, min(start + BLOCK_M, end))`` of expert
    ``e`` (``e = E`` or more past the last tile). Expert ``e`` owns tiles ``[ends[e] - tiles[e], ends[e])``."""
    experts = tl.arange(0, E_PAD)  # [E_PAD]
    counts = tl.load(totals_ptr + experts, mask=experts < E, other=0)  # [E_PAD]
    tiles = (counts + BLOCK_M - 1) // BLOCK_M
    ends = tl.cumsum(tiles, axis=0)  # [E_PAD] inclusive
    e = tl.sum((ends <= tile).to(tl.int32), axis=0)  # the first expert whose tiles reach past `tile`
    mine = experts == e
    stops = tl.cumsum(counts, axis=0)  # [E_PAD] each expert's end in sorted order
    first_tile = tl.sum(tl.where(mine, ends - tiles, 0), axis=0)
    end = tl.sum(tl.where(mine, stops, 0), axis=0)
    start = tl.sum(tl.where(mine, stops - counts, 0), axis=0) + (tile - first_tile) * BLOCK_M
    return e, start, end


@triton.jit
def _scale_rows(s_ptr, r_ptr, s_row, rows, ok, FP8: tl.constexpr):
    """FP8: pointers ``[1, BLOCK_N]`` to the first scale of weight rows ``rows`` (``s_ptr + r[rows] s_row``; rows out of
    range read scale row 0, never stored); else ``s_ptr`` unchanged (unused)."""
    if FP8:
        ptrs = s_ptr + (tl.load(r_ptr + rows, mask=ok, other=0).to(tl.int64) * s_row)[None, :]
    else:
        ptrs = s_ptr
    return ptrs


@triton.jit
def _tile_dot(a, w, acc, sc, k0, IEEE: tl.constexpr, FP8: tl.constexpr):
    """``acc + a w`` for a float weight tile ``w: [BLOCK_K, BLOCK_N]``; FP8: ``w`` holds e4m3 values, converted to
    a's dtype (exact), and the tile's fp32 product is scaled by its rows' scales ``sc[k0 // 128]`` (a tile lies in
    one 128-column scale block: ``BLOCK_K`` divides 128)."""
    if FP8:
        acc += _dot(a, w.to(a.dtype), tl.zeros_like(acc), IEEE) * tl.load(sc + k0 // 128)
    else:
        acc = _dot(a, w, acc, IEEE)
    return acc


@triton.jit
def _gate_up_tile(x_ptr, s_x, tokens, rows, ok_m, w_base, s_row, sc_ptr, sr_ptr, s_scr, out_base, pid_n, inner, DM,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                  IEEE: tl.constexpr, FP8: tl.constexpr):
    """``out[rows, n BLOCK_N ..] = silu(x_tokens w_g^T) * (x_tokens w_u^T)`` with ``w_g, w_u`` the gate rows
    ``n BLOCK_N ..`` and the up rows ``inner + n BLOCK_N ..`` of the weight at ``w_base`` (rows ``s_row`` apart; FP8:
    e4m3 with scales ``sc_ptr`` indexed by ``sr_ptr``, scale rows ``s_scr`` apart)."""
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    ok_n = cols < inner
    ks = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    x_rows = x_ptr + tokens.to(tl.int64)[:, None] * s_x  # [BLOCK_M, 1]
    g_cols = w_base + cols.to(tl.int64)[None, :] * s_row  # [1, BLOCK_N]
    u_cols = w_base + (inner + cols).to(tl.int64)[None, :] * s_row
    sc_g = _scale_rows(sc_ptr, sr_ptr, s_scr, cols, ok_n, FP8)  # [1, BLOCK_N] (FP8)
    sc_u = _scale_rows(sc_ptr, sr_ptr, s_scr, inner + cols, ok_n, FP8)
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, DM, BLOCK_K):
        kk = k0 + ks
        if EVEN_K:
            xs = tl.load(x_rows + kk[None, :], mask=ok_m[:, None], other=0.0)  # [BLOCK_M, BLOCK_K]
            wg = tl.load(g_cols + kk[:, None], mask=ok_n[None, :], other=0.0)  # [BLOCK_K, BLOCK_N]
            wu = tl.load(u_cols + kk[:, None], mask=ok_n[None, :], other=0.0)
        else:
            ok_k = kk < DM
            xs = tl.load(x_rows + kk[None, :], mask=ok_m[:, None] & ok_k[None, :], other=0.0)
            wg = tl.load(g_cols + kk[:, None], mask=ok_k[:, None] & ok_n[None, :], other=0.0)
            wu = tl.load(u_cols + kk[:, None], mask=ok_k[:, None] & ok_n[None, :], other=0.0)
        acc_g = _tile_dot(xs, wg, acc_g, sc_g, k0, IEEE, FP8)
        acc_u = _tile_dot(xs, wu, acc_u, sc_u, k0, IEEE, FP8)
    dtype = out_base.dtype.element_ty
    g = acc_g.to(dtype).to(tl.float32)  # each product rounded, as a plain GEMM stores it
    u = acc_u.to(dtype).to(tl.float32)
    act = (g * tl.sigmoid(g) * u).to(dtype)  # [BLOCK_M, BLOCK_N]
    tl.store(out_base + rows.to(tl.int64)[:, None] * inner + cols[None, :], act, mask=ok_m[:, None] & ok_n[None, :])


@triton.jit
def _gate_up_kernel(x_ptr, s_x, w_ptr, s_we, s_wr, sc_ptr, s_sce, s_scr, sr_ptr, ws_ptr, s_wsr, scs_ptr, s_scsr,
                    srs_ptr, act_ptr, act_s_ptr, totals_ptr, sorted_pair_ptr, T, E, I, I_S, DM, SHARED_TILES,
                    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    E_PAD: tl.constexpr, EVEN_K: tl.constexpr, IEEE: tl.constexpr, FP8: tl.constexpr,
                    FP8_S: tl.constexpr):
    """Program ``(tile, n)``: ``act[rows, n BLOCK_N ..] = silu(x_rows w_g^T) * (x_rows w_u^T)`` with ``w_g, w_u``
    the gate rows ``n BLOCK_N ..`` and the up rows ``I + n BLOCK_N ..`` of the tile's expert (``w_gate_up:
    [E, 2I, DM]``; shared tiles: ``shared_gate_up: [2 I_S, DM]``, rows = tokens, into ``act_s: [T, I_S]``).
    ``FP8`` / ``FP8_S``: the experts' / the shared expert's weight is block FP8 (scales ``[E, R, cdiv(DM, 128)]`` /
    ``[R, ..]`` and scale-row indices), dequantised per tile."""
    tile = tl.program_id(0)
    pid_n = tl.program_id(1)
    lanes = tl.arange(0, BLOCK_M)  # [BLOCK_M]
    if FP8 == FP8_S:  # one kind: the branches pick the pointers, one copy of the loop
        if tile < SHARED_TILES:
            rows = tile * BLOCK_M + lanes  # [BLOCK_M] tokens
            row_end = T
            tokens = rows
            inner = I_S
            w_base = ws_ptr
            s_row = s_wsr
            sc_base = scs_ptr
            sr_base = srs_ptr
            s_sc = s_scsr
            out_base = act_s_ptr
        else:
            e, row0, row_end = _expert_tile(totals_ptr, tile - SHARED_TILES, E, BLOCK_M, E_PAD)
            rows = row0 + lanes  # [BLOCK_M] sorted positions
            tokens = tl.load(sorted_pair_ptr + rows, mask=rows < row_end, other=0) // TOP_K
            inner = I
            w_base = w_ptr + e.to(tl.int64) * s_we
            s_row = s_wr
            sc_base = sc_ptr + e.to(tl.int64) * s_sce
            sr_base = sr_ptr
            s_sc = s_scr
            out_base = act_ptr
        if (tl.min(rows, axis=0) < row_end) & (pid_n * BLOCK_N < inner):  # else past the last tile or columns
            _gate_up_tile(x_ptr, s_x, tokens, rows, rows < row_end, w_base, s_row, sc_base, sr_base, s_sc, out_base,
                          pid_n, inner, DM, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, IEEE, FP8)
    elif tile < SHARED_TILES:
        rows = tile * BLOCK_M + lanes  # [BLOCK_M] tokens
        if pid_n * BLOCK_N < I_S:
            _gate_up_tile(x_ptr, s_x, rows, rows, rows < T, ws_ptr, s_wsr, scs_ptr, srs_ptr, s_scsr, act_s_ptr,
                          pid_n, I_S, DM, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, IEEE, FP8_S)
    else:
        e, row0, row_end = _expert_tile(totals_ptr, tile - SHARED_TILES, E, BLOCK_M, E_PAD)
        if (row0 < row_end) & (pid_n * BLOCK_N < I):  # else past the last tile, or past this matrix's columns
            rows = row0 + lanes  # [BLOCK_M] sorted positions
            ok_m = rows < row_end
            tokens = tl.load(sorted_pair_ptr + rows, mask=ok_m, other=0) // TOP_K
            e64 = e.to(tl.int64)
            _gate_up_tile(x_ptr, s_x, tokens, rows, ok_m, w_ptr + e64 * s_we, s_wr, sc_ptr + e64 * s_sce, sr_ptr,
                          s_scr, act_ptr, pid_n, I, DM, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, IEEE, FP8)


@triton.jit
def _down_tile(a_base, rows, ok_m, out_rows, scale, w_base, s_row, sc_ptr, sr_ptr, s_scr, out_base, pid_n, inner,
               DM, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
               IEEE: tl.constexpr, FP8: tl.constexpr):
    """``out[out_rows, n BLOCK_N ..] = scale (a_rows w^T)[:, n BLOCK_N ..]`` rounded, ``a: [.., inner]`` and the
    weight ``[DM, inner]`` at ``w_base`` (FP8 as :func:`_gate_up_tile`)."""
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    ok_n = cols < DM
    ks = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    a_rows = a_base + rows.to(tl.int64)[:, None] * inner  # [BLOCK_M, 1]
    w_cols = w_base + cols.to(tl.int64)[None, :] * s_row  # [1, BLOCK_N]
    sc = _scale_rows(sc_ptr, sr_ptr, s_scr, cols, ok_n, FP8)  # [1, BLOCK_N] (FP8)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, inner, BLOCK_K):
        kk = k0 + ks
        if EVEN_K:
            a = tl.load(a_rows + kk[None, :], mask=ok_m[:, None], other=0.0)  # [BLOCK_M, BLOCK_K]
            w = tl.load(w_cols + kk[:, None], mask=ok_n[None, :], other=0.0)  # [BLOCK_K, BLOCK_N]
        else:
            ok_k = kk < inner
            a = tl.load(a_rows + kk[None, :], mask=ok_m[:, None] & ok_k[None, :], other=0.0)
            w = tl.load(w_cols + kk[:, None], mask=ok_k[:, None] & ok_n[None, :], other=0.0)
        acc = _tile_dot(a, w, acc, sc, k0, IEEE, FP8)
    y = (acc * scale[:, None]).to(out_base.dtype.element_ty)  # [BLOCK_M, BLOCK_N]
    tl.store(out_base + out_rows.to(tl.int64)[:, None] * DM + cols[None, :], y, mask=ok_m[:, None] & ok_n[None, :])


@triton.jit
def _down_kernel(act_ptr, act_s_ptr, w_ptr, s_we, s_wr, sc_ptr, s_sce, s_scr, sr_ptr, ws_ptr, s_wsr, scs_ptr, s_scsr,
                 srs_ptr, y_ptr, y_s_ptr, totals_ptr, sorted_pair_ptr, weights_ptr, T, E, I, I_S, DM, SHARED_TILES,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, E_PAD: tl.constexpr,
                 EVEN_K: tl.constexpr, IEEE: tl.constexpr, FP8: tl.constexpr, FP8_S: tl.constexpr):
    """Program ``(tile, n)``: ``y[pair] = weight[pair] (act_rows w_down[e]^T)[:, n BLOCK_N ..]`` rounded, each
    sorted row stored at its pair (``y: [P, DM]``); shared tiles: ``y_s[t] = act_s[t] shared_down^T``. ``FP8`` /
    ``FP8_S`` as :func:`_gate_up_kernel`."""
    tile = tl.program_id(0)
    pid_n = tl.program_id(1)
    lanes = tl.arange(0, BLOCK_M)  # [BLOCK_M]
    if FP8 == FP8_S:  # one kind: the branches pick the pointers, one copy of the loop
        if tile < SHARED_TILES:
            rows = tile * BLOCK_M + lanes  # [BLOCK_M] tokens
            row_end = T
            out_rows = rows
            scale = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
            inner = I_S
            a_base = act_s_ptr
            w_base = ws_ptr
            s_row = s_wsr
            sc_base = scs_ptr
            sr_base = srs_ptr
            s_sc = s_scsr
            out_base = y_s_ptr
        else:
            e, row0, row_end = _expert_tile(totals_ptr, tile - SHARED_TILES, E, BLOCK_M, E_PAD)
            rows = row0 + lanes  # [BLOCK_M] sorted positions
            out_rows = tl.load(sorted_pair_ptr + rows, mask=rows < row_end, other=0)  # pairs
            scale = tl.load(weights_ptr + out_rows, mask=rows < row_end, other=0.0)  # [BLOCK_M] router weights
            inner = I
            a_base = act_ptr
            w_base = w_ptr + e.to(tl.int64) * s_we
            s_row = s_wr
            sc_base = sc_ptr + e.to(tl.int64) * s_sce
            sr_base = sr_ptr
            s_sc = s_scr
            out_base = y_ptr
        if tl.min(rows, axis=0) < row_end:  # else past the last tile
            _down_tile(a_base, rows, rows < row_end, out_rows, scale, w_base, s_row, sc_base, sr_base, s_sc, out_base,
                       pid_n, inner, DM, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, IEEE, FP8)
    elif tile < SHARED_TILES:
        rows = tile * BLOCK_M + lanes  # [BLOCK_M] tokens
        one = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
        _down_tile(act_s_ptr, rows, rows < T, rows, one, ws_ptr, s_wsr, scs_ptr, srs_ptr, s_scsr, y_s_ptr, pid_n,
                   I_S, DM, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, IEEE, FP8_S)
    else:
        e, row0, row_end = _expert_tile(totals_ptr, tile - SHARED_TILES, E, BLOCK_M, E_PAD)
        if row0 < row_end:  # else past the last tile
            rows = row0 + lanes  # [BLOCK_M] sorted positions
            ok_m = rows < row_end
            pairs = tl.load(sorted_pair_ptr + rows, mask=ok_m, other=0)
            scale = tl.load(weights_ptr + pairs, mask=ok_m, other=0.0)  # [BLOCK_M] router weights
            e64 = e.to(tl.int64)
            _down_tile(act_ptr, rows, ok_m, pairs, scale, w_ptr + e64 * s_we, s_wr, sc_ptr + e64 * s_sce, sr_ptr,
                       s_scr, y_ptr, pid_n, I, DM, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, IEEE, FP8)


@triton.jit
def _combine_kernel(y_ptr, y_s_ptr, x_ptr, s_x, gate_ptr, out_ptr, DM, TOP_K: tl.constexpr,
                    HAS_SHARED: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program ``(t, d)``: ``out[t, d BLOCK_D ..] = sum_{j < k} y[t k + j] + sigmoid(x_t . gate) y_s[t]`` in fp32
    (``j`` in order), one rounding."""
    t = tl.program_id(0).to(tl.int64)
    ds = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    cols = tl.program_id(1) * BLOCK_D + ds
    ok = cols < DM
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for j in range(TOP_K):
        acc += tl.load(y_ptr + (t * TOP_K + j) * DM + cols, mask=ok, other=0.0).to(tl.float32)
    if HAS_SHARED:
        dot = tl.zeros([BLOCK_D], dtype=tl.float32)
        for d0 in range(0, DM, BLOCK_D):
            okd = d0 + ds < DM
            dot += (tl.load(x_ptr + t * s_x + d0 + ds, mask=okd, other=0.0).to(tl.float32)
                    * tl.load(gate_ptr + d0 + ds, mask=okd, other=0.0).to(tl.float32))
        gate = tl.sigmoid(tl.sum(dot, axis=0))
        acc += gate * tl.load(y_s_ptr + t * DM + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * DM + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)
