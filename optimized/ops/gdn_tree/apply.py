r"""The split pipeline's second kernel (the apply) and the one-kernel verify.

The apply runs one program per (request, value head, block of V columns): it streams its ``S0`` tile ``[K, BV]``
once, forms ``K S0`` and ``Q S0`` and finishes ``Delta = TB (V - diag(Gamma) K S0)`` and ``O = scale (diag(Gamma) Q
S0 + QKD Delta)`` from the solve's tiles. The one-kernel form (``KernelConfig.split = False``) does the solve's work
itself per program, for small batches where one wave holds every program.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..pdl import allow_dependents, prefetch_l2
from ..tree_meta import tree_size
from .primitives import (QKD_SCALE, TB_SCALE, _ancestor_mask, _diagonal, _doubling_levels, _gram_products, _inverse,
                         _levels_of, _load_depth, _load_gates, _path_decay, _real_rows, _round_qk, _scratch_tile,
                         _scratch_value, _tf32_round)


@triton.jit
def _load_gate(z_ptr, s_zb, s_zn, s_zh, gate_w_ptr, b64, nodes, real, hv, vcols, GATE: tl.constexpr):
    """With ``GATE`` (:class:`OutputGate`) the tile's ``weight * silu(z)`` (``[NP, BV]`` fp32; padding rows 0),
    loaded early so that its latency hides behind the verify's work; else a scalar 0 (unused)."""
    if GATE:
        z = tl.load(z_ptr + b64 * s_zb + nodes[:, None] * s_zn + hv * s_zh + vcols[None, :], mask=real[:, None],
                    other=0.0).to(tl.float32)  # [NP, BV]
        gate = tl.load(gate_w_ptr + vcols).to(tl.float32)[None, :] * (z * tl.sigmoid(z))
    else:
        gate = 0.0
    return gate


@triton.jit
def _store_output(o, o_ptr, b64, nodes, hv, pid_v, N, gate, gate_parts_ptr, HV: tl.constexpr, V: tl.constexpr,
                  NP: tl.constexpr, BV: tl.constexpr, GATE: tl.constexpr, PIECE: tl.constexpr):
    """Store the ``[NP, BV]`` output tile of (value head ``hv``, V block ``pid_v``) rounded to o's dtype, or with
    ``GATE`` (:class:`OutputGate`; ``gate = weight * silu(z)`` from :func:`_load_gate`) ``round(round(o) * gate)``
    and ``round(o)``'s sums of squares over the block's columns, in the first of its ``BV / PIECE`` pieces (zeros
    in the others: a row sum, no reshape; padding rows: zeros; rows past N: not stored)."""
    rows = nodes < N  # [NP]
    vcols = pid_v * BV + tl.arange(0, BV)  # [BV]
    out_off = ((b64 * N + nodes[:, None]) * HV + hv) * V + vcols[None, :]  # [NP, BV]
    if GATE:
        o_r = o.to(o_ptr.dtype.element_ty).to(tl.float32)  # [NP, BV] the stored output the norm would read
        tl.store(o_ptr + out_off, (o_r * gate).to(o_ptr.dtype.element_ty), mask=rows[:, None])
        piece = tl.arange(0, BV // PIECE)  # [BV / PIECE] the block's pieces: its sum in the first, zeros after
        sq = tl.where(piece[None, :] == 0, tl.sum(o_r * o_r, axis=1)[:, None], 0.0)  # [NP, BV / PIECE]
        tl.store(gate_parts_ptr + ((b64 * N + nodes[:, None]) * HV + hv) * (V // PIECE) + pid_v * (BV // PIECE)
                 + piece[None, :], sq, mask=rows[:, None])
    else:
        tl.store(o_ptr + out_off, o.to(o_ptr.dtype.element_ty), mask=rows[:, None])
    return out_off, rows


@triton.jit
def _store_output_and_delta(o, delta, o_ptr, delta_ptr, o_desc, delta_desc, b, b64, nodes, hv, pid_v, N, gate,
                            gate_parts_ptr, HV: tl.constexpr, V: tl.constexpr, NP: tl.constexpr, BV: tl.constexpr,
                            GATE: tl.constexpr, PIECE: tl.constexpr, TMA: tl.constexpr):
    """Store the ``[NP, BV]`` output and delta tiles of (request ``b``, value head ``hv``, V block ``pid_v``): with
    ``TMA`` and no ``GATE`` through the descriptors (``[1, NP, 1, BV]`` blocks; rows past N clipped by them), else
    through :func:`_store_output` and pointers. Returns the ``[NP]`` mask of rows below N."""
    if TMA and not GATE:
        o_desc.store([b, 0, hv, pid_v * BV], o.to(o_desc.dtype).reshape(1, NP, 1, BV))
        delta_desc.store([b, 0, hv, pid_v * BV], delta.reshape(1, NP, 1, BV))
    else:
        out_off, rows = _store_output(o, o_ptr, b64, nodes, hv, pid_v, N, gate, gate_parts_ptr, HV, V, NP, BV, GATE,
                                      PIECE)
        tl.store(delta_ptr + out_off, delta, mask=rows[:, None])
    return nodes < N


@triton.jit
def _gdn_tree_apply_kernel(
    q_ptr, k_ptr, v_ptr, pool_ptr, slots_ptr, num_nodes_ptr, log_gamma_ptr, k_rnorm_ptr, q_rnorm_ptr,
    tb_ptr, qkd_ptr, o_ptr, delta_ptr, z_ptr, gate_w_ptr, gate_parts_ptr,
    scale, N, s_qb, s_qn, s_qh, s_kb, s_kn, s_kh, s_vb, s_vn, s_vh, s_zb, s_zn, s_zh,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    NP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr, PRECISION: tl.constexpr,
    QK16: tl.constexpr, GATE: tl.constexpr, PIECE: tl.constexpr, PDL: tl.constexpr, SIGNAL: tl.constexpr,
    HAS_NUM: tl.constexpr, SCRATCH16: tl.constexpr,
    pool_desc, q_desc, k_desc, v_desc, tb_desc, qkd_desc, o_desc, delta_desc, TMA: tl.constexpr,
):
    """Split verify, part 2, one program per (V block, request, value head): one pass over ``S0``'s tile,
    ``Delta = TB (V - diag(Gamma) K S0)``, ``O = scale (diag(Gamma) Q S0 + QKD Delta)`` (``GATE``: stored through
    :func:`_store_output`'s half of the gated RMSNorm). ``PDL``: launched as a programmatic dependent launch behind
    the solve kernel (``KernelConfig.apply_pdl``): the pass over ``S0`` reads only what the solve does not write
    (q, k, the state, the slots and sizes), then the program waits for the solve before it reads its outputs.
    ``SIGNAL``: a PDL-launched successor may launch as soon as every program has started. ``TMA``: every tile
    moves through tensor descriptors (:func:`_tma_descriptors`; padding nodes' rows zeroed after the loads, rows
    past N zero-filled and dropped by the hardware) instead of per-thread pointers; with ``GATE`` the output
    still goes through :func:`_store_output`."""
    allow_dependents(SIGNAL)  # a PDL-launched successor (gdn_tree_commit(pdl=True)) may launch now
    pid_v = tl.program_id(0)  # fastest: the V blocks of one value head share its TB / QKD tiles in L2
    pid_bh = tl.program_id(1)
    b = pid_bh // HV
    hv = pid_bh % HV
    h = hv // (HV // H)
    b64 = b.to(tl.int64)
    n_b = tree_size(num_nodes_ptr, b, N, HAS_NUM)
    slot = tl.load(slots_ptr + b).to(tl.int64)
    nodes = tl.arange(0, NP)  # [NP]
    real = nodes < n_b
    vcols = pid_v * BV + tl.arange(0, BV)  # [BV]
    tile = _scratch_tile(b64, hv, HV, NP)  # [NP, NP] this head's TB / QKD offsets
    gate = _load_gate(z_ptr, s_zb, s_zn, s_zh, gate_w_ptr, b64, nodes, real, hv, vcols, GATE)  # [NP, BV] or 0
    ks = tl.zeros([NP, BV], dtype=tl.float32)  # [NP, BV] K S0
    qs = tl.zeros([NP, BV], dtype=tl.float32)  # [NP, BV] Q S0
    state = pool_ptr + (slot * HV + hv) * (K * V)
    q_rows = q_ptr + b64 * s_qb + nodes[:, None] * s_qn + h * s_qh  # [NP, 1]
    k_rows = k_ptr + b64 * s_kb + nodes[:, None] * s_kn + h * s_kh  # [NP, 1]
    state_row = ((slot * HV + hv) * K).to(tl.int32)  # the tile's first row in pool_desc's [P HV K, V] rows
    for k0 in range(0, K, BK):
        kc = k0 + tl.arange(0, BK)  # [BK]
        if TMA:
            q_c = _real_rows(q_desc.load([b, 0, h, k0]).reshape(NP, BK).to(tl.float32), real, HAS_NUM)  # [NP, BK]
            k_c = _real_rows(k_desc.load([b, 0, h, k0]).reshape(NP, BK).to(tl.float32), real, HAS_NUM)  # [NP, BK]
            s_c = _tf32_round(pool_desc.load([state_row + k0, pid_v * BV]), PRECISION)  # [BK, BV]
        else:
            q_c = tl.load(q_rows + kc[None, :], mask=real[:, None], other=0.0).to(tl.float32)  # [NP, BK]
            k_c = tl.load(k_rows + kc[None, :], mask=real[:, None], other=0.0).to(tl.float32)  # [NP, BK]
            s_c = _tf32_round(tl.load(state + kc[:, None] * V + vcols[None, :]), PRECISION)  # [BK, BV]
        ks = tl.dot(_round_qk(k_c, PRECISION, QK16), s_c, ks, input_precision=PRECISION)
        qs = tl.dot(_round_qk(q_c, PRECISION, QK16), s_c, qs, input_precision=PRECISION)
    if PDL:
        tl.extra.cuda.gdc_wait()  # from here on the solve's outputs are complete and visible
    if L2NORM:
        ks = ks * tl.load(k_rnorm_ptr + (b64 * N + nodes) * H + h, mask=real, other=0.0)[:, None]
        qs = qs * tl.load(q_rnorm_ptr + (b64 * NP + nodes) * H + h)[:, None]
    gamma = tl.exp(tl.load(log_gamma_ptr + (b64 * N + nodes) * HV + hv, mask=real, other=0.0))  # [NP]
    scratch_row = (pid_bh * NP).to(tl.int32)  # this (request, value head)'s first row of tb_desc / qkd_desc
    if TMA:
        v_t = _real_rows(v_desc.load([b, 0, hv, pid_v * BV]).reshape(NP, BV).to(tl.float32), real,
                         HAS_NUM)  # [NP, BV]
        tb = _scratch_value(tb_desc.load([scratch_row, 0]), TB_SCALE, PRECISION, SCRATCH16)  # [NP, NP]
    else:
        v_t = tl.load(v_ptr + b64 * s_vb + nodes[:, None] * s_vn + hv * s_vh + vcols[None, :],
                      mask=real[:, None], other=0.0).to(tl.float32)  # [NP, BV]
        tb = _scratch_value(tl.load(tb_ptr + tile), TB_SCALE, PRECISION, SCRATCH16)  # [NP, NP]
    delta = tl.dot(tb, _tf32_round(v_t - gamma[:, None] * ks, PRECISION), input_precision=PRECISION)  # [NP, BV]
    if TMA:  # (late: fewer live registers)
        qkd = _scratch_value(qkd_desc.load([scratch_row, 0]), QKD_SCALE, PRECISION, SCRATCH16)  # [NP, NP]
    else:
        qkd = _scratch_value(tl.load(qkd_ptr + tile), QKD_SCALE, PRECISION, SCRATCH16)  # [NP, NP]
    o = (gamma[:, None] * qs + tl.dot(qkd, _tf32_round(delta, PRECISION), input_precision=PRECISION)) * scale
    # padding rows: zeros (their q, v rows are, and so are their rows of TB and QKD)
    _store_output_and_delta(o, delta, o_ptr, delta_ptr, o_desc, delta_desc, b, b64, nodes, hv, pid_v, N, gate,
                            gate_parts_ptr, HV, V, NP, BV, GATE, PIECE, TMA)


@triton.jit
def _gdn_tree_verify_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr,
    pool_ptr, slots_ptr, words_ptr, depth_ptr, num_nodes_ptr,
    o_ptr, delta_ptr, log_gamma_ptr, k_rnorm_ptr, z_ptr, gate_w_ptr, gate_parts_ptr,
    scale, N,
    s_qb, s_qn, s_qh, s_kb, s_kn, s_kh, s_vb, s_vn, s_vh, s_gb, s_gn, s_gh, s_bb, s_bn, s_bh, s_zb, s_zn, s_zh,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, W: tl.constexpr,
    NP: tl.constexpr, LOG_NP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    GATED: tl.constexpr, BETA_TWO: tl.constexpr, L2NORM: tl.constexpr,
    PRECISION: tl.constexpr, WORD_BITS: tl.constexpr, WORD_VECTORS: tl.constexpr, QK16: tl.constexpr,
    DOT16: tl.constexpr, PDL: tl.constexpr, STATE_LINES: tl.constexpr, GATE: tl.constexpr, PIECE: tl.constexpr,
    SIGNAL: tl.constexpr, HAS_NUM: tl.constexpr, GATES_FIRST: tl.constexpr,
    pool_desc, q_desc, k_desc, v_desc, o_desc, delta_desc, TMA: tl.constexpr, HALVES: tl.constexpr,
):
    """Fused verify, one program per (request, value head, V block): everything in one pass (the ``[N, N]`` work is
    redone by every V block of a value head; pays off when there are few programs, i.e. small batches). ``PDL``:
    launched as a programmatic dependent launch (:mod:`~lumotree.optimized.ops.pdl`): the program prefetches its
    ``S0`` tile into L2 (``STATE_LINES`` 128-byte lines per state row), which no kernel of the step writes, then
    waits for the previous kernel (whose output q, k, v and the gates are) before it reads anything else. ``GATE``:
    the output is stored through :func:`_store_output`'s half of the gated RMSNorm (:class:`OutputGate`).
    ``SIGNAL``: a PDL-launched successor may launch as soon as every program has started. ``GATES_FIRST`` (up to
    N = 64): the gates and the tree's depths are loaded before the K loop and used after it (else the decay is
    formed before the loop and the depths are read after it). ``TMA``: q, k, v, the state and (without ``GATE``) o
    and delta through tensor descriptors, as in :func:`_gdn_tree_apply_kernel`."""
    allow_dependents(SIGNAL)  # a PDL-launched successor (gdn_tree_commit(pdl=True)) may launch now
    pid_bh = tl.program_id(0)
    pid_v = tl.program_id(1)
    b = pid_bh // HV
    hv = pid_bh % HV
    h = hv // (HV // H)
    b64 = b.to(tl.int64)
    slot = tl.load(slots_ptr + b).to(tl.int64)
    state = pool_ptr + (slot * HV + hv) * (K * V)
    if PDL:
        lines = tl.arange(0, STATE_LINES)  # [STATE_LINES]
        prefetch_l2(state + tl.arange(0, K)[:, None] * V + pid_v * BV + lines[None, :] * 32)  # [K, STATE_LINES]
        tl.extra.cuda.gdc_wait()  # from here on the previous kernel's writes are visible
    n_b = tree_size(num_nodes_ptr, b, N, HAS_NUM)
    nodes = tl.arange(0, NP)  # [NP]
    real = nodes < n_b  # [NP] padding rows are never read
    vcols = pid_v * BV + tl.arange(0, BV)  # [BV]
    anc = _ancestor_mask(words_ptr, b64, n_b, N, W, NP, WORD_BITS, WORD_VECTORS)  # [NP, NP] M
    gate_loads = _load_gates(g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, b64, hv, n_b, s_gb, s_gn, s_gh, s_bb, s_bn,
                             s_bh, NP, GATED)
    if GATES_FIRST:  # the gates' and depths' loads run under the K loop, their uses come after it
        depth = _load_depth(depth_ptr, b64, N, n_b, NP)  # [NP]
    else:
        log_gamma, gamma, decay, beta = _path_decay(anc, gate_loads, n_b, NP, GATED, BETA_TWO)
    gate = _load_gate(z_ptr, s_zb, s_zn, s_zh, gate_w_ptr, b64, nodes, real, hv, vcols, GATE)  # [NP, BV] or 0

    # one pass over S0's tile: K K^T, Q K^T, K S0, Q S0 (and the squared norms of q and k)
    kk = tl.zeros([NP, NP], dtype=tl.float32)  # [NP, NP]
    qk = tl.zeros([NP, NP], dtype=tl.float32)  # [NP, NP]
    ks = tl.zeros([NP, BV], dtype=tl.float32)  # [NP, BV]
    qs = tl.zeros([NP, BV], dtype=tl.float32)  # [NP, BV]
    k_sq = tl.zeros([NP], dtype=tl.float32)  # [NP]
    q_sq = tl.zeros([NP], dtype=tl.float32)  # [NP]
    q_rows = q_ptr + b64 * s_qb + nodes[:, None] * s_qn + h * s_qh  # [NP, 1]
    k_rows = k_ptr + b64 * s_kb + nodes[:, None] * s_kn + h * s_kh  # [NP, 1]
    state_row = ((slot * HV + hv) * K).to(tl.int32)  # the tile's first row in pool_desc's [P HV K, V] rows
    for k0 in range(0, K, BK):
        kc = k0 + tl.arange(0, BK)  # [BK]
        if TMA:
            q_raw = _real_rows(q_desc.load([b, 0, h, k0]).reshape(NP, BK), real, HAS_NUM)  # [NP, BK] input dtype
            k_raw = _real_rows(k_desc.load([b, 0, h, k0]).reshape(NP, BK), real, HAS_NUM)  # [NP, BK]
            s_c = _tf32_round(pool_desc.load([state_row + k0, pid_v * BV]), PRECISION)  # [BK, BV]
        else:
            q_raw = tl.load(q_rows + kc[None, :], mask=real[:, None], other=0.0)  # [NP, BK] input dtype
            k_raw = tl.load(k_rows + kc[None, :], mask=real[:, None], other=0.0)  # [NP, BK]
            s_c = _tf32_round(tl.load(state + kc[:, None] * V + vcols[None, :]), PRECISION)  # [BK, BV]
        q_c = q_raw.to(tl.float32)  # [NP, BK]
        k_c = k_raw.to(tl.float32)  # [NP, BK]
        if L2NORM:
            if not QK16:  # 16-bit keys: |k|^2 is K K^T's diagonal (exact products), read after the loop
                k_sq += tl.sum(k_c * k_c, axis=1)
            q_sq += tl.sum(q_c * q_c, axis=1)
        q_c = _round_qk(q_c, PRECISION, QK16)
        k_c = _round_qk(k_c, PRECISION, QK16)
        kk, qk = _gram_products(q_raw, k_raw, q_c, k_c, kk, qk, PRECISION, DOT16)
        ks = tl.dot(k_c, s_c, ks, input_precision=PRECISION)
        qs = tl.dot(q_c, s_c, qs, input_precision=PRECISION)
    if L2NORM:
        if QK16:
            k_sq = _diagonal(kk, NP)
        k_rn = 1.0 / tl.sqrt(k_sq + 1e-6)  # [NP]
        q_rn = 1.0 / tl.sqrt(q_sq + 1e-6)  # [NP]
        kk = kk * k_rn[:, None] * k_rn[None, :]
        qk = qk * q_rn[:, None] * k_rn[None, :]
        ks = ks * k_rn[:, None]
        qs = qs * q_rn[:, None]

    if GATES_FIRST:
        log_gamma, gamma, decay, beta = _path_decay(anc, gate_loads, n_b, NP, GATED, BETA_TWO)
    strict = anc & (nodes[:, None] != nodes[None, :])  # [NP, NP] M°
    neg_a = tl.where(strict, -(beta[:, None] * kk * decay), 0.0)  # [NP, NP] -A
    if TMA:
        v_t = _real_rows(v_desc.load([b, 0, hv, pid_v * BV]).reshape(NP, BV).to(tl.float32), real,
                         HAS_NUM)  # [NP, BV]
    else:
        v_t = tl.load(v_ptr + b64 * s_vb + nodes[:, None] * s_vn + hv * s_vh + vcols[None, :],
                      mask=real[:, None], other=0.0).to(tl.float32)  # [NP, BV]
    rhs = beta[:, None] * (v_t - gamma[:, None] * ks)  # [NP, BV]
    if GATES_FIRST:
        levels = _levels_of(depth, LOG_NP)
    else:
        levels = _doubling_levels(depth_ptr, b64, N, n_b, NP, LOG_NP)
    t_inv = _inverse(neg_a, levels, NP, PRECISION, False, HALVES)  # [NP, NP]
    delta = tl.dot(_tf32_round(t_inv, PRECISION), _tf32_round(rhs, PRECISION),
                   input_precision=PRECISION)  # [NP, BV]
    o = (gamma[:, None] * qs + tl.dot(_tf32_round(qk * decay, PRECISION), _tf32_round(delta, PRECISION),
                                      input_precision=PRECISION)) * scale  # [NP, BV]
    rows = _store_output_and_delta(o, delta, o_ptr, delta_ptr, o_desc, delta_desc, b, b64, nodes, hv, pid_v, N,
                                   gate, gate_parts_ptr, HV, V, NP, BV, GATE, PIECE, TMA)  # padding rows: zeros
    first_v = (nodes * 0 + pid_v) == 0  # [NP] one V block writes the per-node scalars
    tl.store(log_gamma_ptr + (b64 * N + nodes) * HV + hv, log_gamma, mask=rows & first_v)
    if L2NORM:
        tl.store(k_rnorm_ptr + (b64 * N + nodes) * H + h, tl.where(real, k_rn, 0.0),
                 mask=rows & first_v & ((nodes * 0 + hv) % (HV // H) == 0))


