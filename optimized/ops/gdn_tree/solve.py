r"""The split pipeline's first kernel: per (request, value head) the ``[N, N]`` system of the closed form.

Each program forms ``K K^T`` and ``Q K^T`` (with the L2 norms of q and k applied as row / column scales), the gates,
``log Gamma`` (written out), ``QKD = Q K^T ⊙ D`` and ``-A``, inverts ``I + A`` by doubling and hands ``TB = (I +
A)^{-1} diag(beta)`` and ``QKD`` to the apply kernel through scratch tiles (fp16 scaled by a power of two with
``SCRATCH16``). :func:`_gdn_tree_solve_rows_kernel` splits the rows over two programs past N = 32: the lower half
forms the block below the diagonal from the upper half's inverse.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..pdl import allow_dependents
from ..tree_meta import tree_size
from .primitives import (
    QKD_SCALE,
    TB_SCALE,
    _ancestor_block,
    _ancestor_mask,
    _cross_products,
    _diagonal,
    _doubling_levels,
    _gate_values,
    _gates,
    _gram_products,
    _head_operands,
    _inverse,
    _inverse_unit_lower,
    _levels_of,
    _load_depth,
    _load_gates,
    _real_rows,
    _round_qk,
    _scratch_block,
    _scratch_tile,
    _scratch_value,
    _store_scratch,
    _tf32_round,
)


@triton.jit
def _gdn_tree_solve_kernel(
    q_ptr, k_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, words_ptr, depth_ptr, num_nodes_ptr,
    log_gamma_ptr, k_rnorm_ptr, q_rnorm_ptr, tb_ptr, qkd_ptr,
    N, s_qb, s_qn, s_qh, s_kb, s_kn, s_kh, s_gb, s_gn, s_gh, s_bb, s_bn, s_bh,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, W: tl.constexpr,
    NP: tl.constexpr, LOG_NP: tl.constexpr, BK: tl.constexpr, HEADS: tl.constexpr,
    GATED: tl.constexpr, BETA_TWO: tl.constexpr, L2NORM: tl.constexpr,
    PRECISION: tl.constexpr, WORD_BITS: tl.constexpr, WORD_VECTORS: tl.constexpr, QK16: tl.constexpr,
    DOT16: tl.constexpr, PDL: tl.constexpr, HAS_NUM: tl.constexpr, SCRATCH16: tl.constexpr,
    GATES_FIRST: tl.constexpr, q_desc, k_desc, TMA: tl.constexpr, HALVES: tl.constexpr,
):
    """Split verify, part 1, one program per (request, HEADS value heads of one GVA group): the ``[N, N]``
    quantities that do not depend on V (``K K^T`` and ``Q K^T`` once for the HEADS value heads).

    Writes ``log Gamma`` and ``k_rnorm`` (factors), ``q_rnorm`` and the two ``[NP, NP]`` operands of part 2 per value
    head: ``TB = (I + A)^{-1} diag(beta)`` and ``QKD = Q K^T ⊙ D`` (``SCRATCH16``: :func:`_store_scratch`).
    ``GATES_FIRST`` (one value head, ``HEADS == 1``, up to N = 64): the gates and the tree's depths are loaded
    before the K loop and used after it, so that their loads' latency runs under the loop instead of on the path to
    the doubling (B = 1, N = 64, H100: verify + commit 22.9 -> 22.4 us; at N = 128 the 8-warp solve would spill
    1128 instead of 400 bytes, compile-only). Two heads per program: both heads' gates load together and both
    heads' doubling operands are formed before either doubling, so that ``K K^T``, ``Q K^T`` and the masks die
    first (B = 64, N = 64: 392 bytes of spills before, none now, compile-only; H100, verify + commit 385.7 -> 369.1
    us). ``HALVES``: the inverse from its diagonal halves
    (:func:`_inverse_unit_lower_halves`). ``TMA``: q and k through tensor descriptors (:func:`_real_rows`).
    """
    tl.static_assert(HEADS == 1 or not GATES_FIRST, "GATES_FIRST holds one head's gates")
    allow_dependents(PDL)  # the apply (KernelConfig.apply_pdl) reads none of this kernel's outputs before its wait
    pid = tl.program_id(0)
    b = pid // (HV // HEADS)
    hv0 = (pid % (HV // HEADS)) * HEADS  # first value head of this program
    h = hv0 // (HV // H)
    b64 = b.to(tl.int64)
    n_b = tree_size(num_nodes_ptr, b, N, HAS_NUM)
    nodes = tl.arange(0, NP)  # [NP]
    real = nodes < n_b
    # the mask first, a gather of the tree's bitsets: its latency runs under the K loop (B = 1: 0.5-1.7 us less)
    anc = _ancestor_mask(words_ptr, b64, n_b, N, W, NP, WORD_BITS, WORD_VECTORS)  # [NP, NP] M
    if GATES_FIRST:  # inputs, not products of the loop: loaded now, used after it (HEADS == 1)
        depth = _load_depth(depth_ptr, b64, N, n_b, NP)  # [NP]
        gate_loads = _load_gates(g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, b64, hv0, n_b, s_gb, s_gn, s_gh, s_bb,
                                 s_bn, s_bh, NP, GATED)
    kk = tl.zeros([NP, NP], dtype=tl.float32)  # [NP, NP] K K^T
    qk = tl.zeros([NP, NP], dtype=tl.float32)  # [NP, NP] Q K^T
    k_sq = tl.zeros([NP], dtype=tl.float32)
    q_sq = tl.zeros([NP], dtype=tl.float32)
    q_rows = q_ptr + b64 * s_qb + nodes[:, None] * s_qn + h * s_qh  # [NP, 1]
    k_rows = k_ptr + b64 * s_kb + nodes[:, None] * s_kn + h * s_kh  # [NP, 1]
    for k0 in range(0, K, BK):
        kc = k0 + tl.arange(0, BK)  # [BK]
        if TMA:
            q_raw = _real_rows(q_desc.load([b, 0, h, k0]).reshape(NP, BK), real, HAS_NUM)  # [NP, BK] input dtype
            k_raw = _real_rows(k_desc.load([b, 0, h, k0]).reshape(NP, BK), real, HAS_NUM)  # [NP, BK]
        else:
            q_raw = tl.load(q_rows + kc[None, :], mask=real[:, None], other=0.0)  # [NP, BK] input dtype
            k_raw = tl.load(k_rows + kc[None, :], mask=real[:, None], other=0.0)  # [NP, BK]
        q_c = q_raw.to(tl.float32)  # [NP, BK]
        k_c = k_raw.to(tl.float32)  # [NP, BK]
        if L2NORM:
            if not QK16:  # 16-bit keys: |k|^2 is K K^T's diagonal (exact products), read after the loop
                k_sq += tl.sum(k_c * k_c, axis=1)
            q_sq += tl.sum(q_c * q_c, axis=1)
        q_c = _round_qk(q_c, PRECISION, QK16)
        k_c = _round_qk(k_c, PRECISION, QK16)
        kk, qk = _gram_products(q_raw, k_raw, q_c, k_c, kk, qk, PRECISION, DOT16)
    first = (nodes * 0 + hv0) % (HV // H) == 0  # [NP] one program of the group writes the q/k scalars
    if L2NORM:
        if QK16:
            k_sq = _diagonal(kk, NP)
        k_rn = tl.where(real, 1.0 / tl.sqrt(k_sq + 1e-6), 0.0)  # [NP]
        q_rn = tl.where(real, 1.0 / tl.sqrt(q_sq + 1e-6), 0.0)  # [NP]
        kk = kk * k_rn[:, None] * k_rn[None, :]
        qk = qk * q_rn[:, None] * k_rn[None, :]
        tl.store(k_rnorm_ptr + (b64 * N + nodes) * H + h, k_rn, mask=(nodes < N) & first)
        tl.store(q_rnorm_ptr + (b64 * NP + nodes) * H + h, q_rn, mask=first)
    # several heads: the gates only now (fewer tiles live through the K loop: registers); heads two at a time, both
    # heads' operands formed before either doubling (K K^T, Q K^T and the masks die before the doublings)
    strict = anc & (nodes[:, None] != nodes[None, :])  # [NP, NP] M°
    if GATES_FIRST:
        levels = _levels_of(depth, LOG_NP)
        g, beta = _gate_values(gate_loads, n_b, NP, GATED, BETA_TWO)  # [NP] each
    for j in tl.static_range(0, HEADS, 2):
        hv = hv0 + j
        if not GATES_FIRST:
            g, beta = _gates(g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, b64, hv, n_b, s_gb, s_gn, s_gh, s_bb, s_bn,
                             s_bh, NP, GATED, BETA_TWO)  # [NP] each
        if j + 1 < HEADS:  # loaded with the first head's
            g_2, beta_2 = _gates(g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, b64, hv + 1, n_b, s_gb, s_gn, s_gh, s_bb,
                                 s_bn, s_bh, NP, GATED, BETA_TWO)  # [NP] each
        neg_a = _head_operands(anc, strict, kk, qk, g, beta, log_gamma_ptr, qkd_ptr, b64, hv, N, HV, NP, PRECISION,
                               SCRATCH16)  # [NP, NP] -A
        if j + 1 < HEADS:
            neg_a_2 = _head_operands(anc, strict, kk, qk, g_2, beta_2, log_gamma_ptr, qkd_ptr, b64, hv + 1, N, HV, NP,
                                     PRECISION, SCRATCH16)  # [NP, NP] -A of the second head
        if not GATES_FIRST and j == 0:
            levels = _doubling_levels(depth_ptr, b64, N, n_b, NP, LOG_NP)
        t_inv = _inverse(neg_a, levels, NP, PRECISION, PRECISION != "ieee", HALVES)  # [NP, NP]
        _store_scratch(tb_ptr + _scratch_tile(b64, hv, HV, NP), t_inv * beta[None, :], TB_SCALE, PRECISION,
                       SCRATCH16)
        if j + 1 < HEADS:
            t_inv = _inverse(neg_a_2, levels, NP, PRECISION, PRECISION != "ieee", HALVES)  # [NP, NP]
            _store_scratch(tb_ptr + _scratch_tile(b64, hv + 1, HV, NP), t_inv * beta_2[None, :], TB_SCALE,
                           PRECISION, SCRATCH16)


@triton.jit
def _gdn_tree_solve_rows_kernel(
    q_ptr, k_ptr, g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, words_ptr, depth_ptr, num_nodes_ptr,
    log_gamma_ptr, k_rnorm_ptr, q_rnorm_ptr, tb_ptr, qkd_ptr, ready_ptr, c_ptr,
    N, s_qb, s_qn, s_qh, s_kb, s_kn, s_kh, s_gb, s_gn, s_gh, s_bb, s_bn, s_bh,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, W: tl.constexpr,
    NP: tl.constexpr, LOG_NP: tl.constexpr, BK: tl.constexpr,
    GATED: tl.constexpr, BETA_TWO: tl.constexpr, L2NORM: tl.constexpr,
    PRECISION: tl.constexpr, WORD_BITS: tl.constexpr, QK16: tl.constexpr,
    DOT16: tl.constexpr, PDL: tl.constexpr, HAS_NUM: tl.constexpr, SCRATCH16: tl.constexpr,
):
    """The split solve by row halves (``KernelConfig.row_halves``): two programs per (request, value head), one per
    half of the ``NP`` rows, each writing its rows of the outputs of :func:`_gdn_tree_solve_kernel` (the same
    ``TB``, ``QKD``, ``log Gamma`` and norms), with ``[NP/2, NP/2]`` tiles.

    With the upper half ``u`` and the lower ``l`` (``A_ul = 0``: ancestors come first), ``T = (I + A)^{-1}`` is
    ``[[T_uu, 0], [T_ll (-A_lu) T_uu, T_ll]]``, ``T_ii = (I + A_ii)^{-1}`` by doubling with the tree's ``L``
    (:func:`_inverse_unit_lower_halves`; checked by ``nilpotent/sympy``). The upper program forms ``K_u K_u^T``,
    ``Q_u K_u^T``, inverts its block, stores ``TB_uu = T_uu diag(beta_u)``, zeros right of it, and sets the pair's
    ready flag. The lower one forms its rows against both halves (``K_l K_u^T``, ``K_l K_l^T``, the same with Q),
    inverts ``I + A_ll`` and forms ``C = T_ll (-A_lu)`` while the upper program runs, then waits for the flag and
    stores ``TB_lu = C TB_uu``. Deadlock-free: the upper program of a pair has the lower one's program id less one,
    so it has started whenever the lower one runs. ``ready_ptr``: ``[B * HV]`` int32 zeros; ``c_ptr``: ``[B * HV,
    NP/2, NP/2]`` fp32, the lower programs' ``C``."""
    allow_dependents(PDL)  # the apply (KernelConfig.apply_pdl) reads none of this kernel's outputs before its wait
    HALF: tl.constexpr = NP // 2
    pid = tl.program_id(0)
    lower = pid % 2  # 0: the upper half of the rows, 1: the lower
    b = pid // (2 * HV)
    hv = (pid // 2) % HV
    h = hv // (HV // H)
    b64 = b.to(tl.int64)
    n_b = tree_size(num_nodes_ptr, b, N, HAS_NUM)
    upper = tl.arange(0, HALF)  # [HALF] the upper half's nodes
    r0 = lower * HALF
    own = r0 + upper  # [HALF] this program's rows
    own_real = own < n_b
    # the diagonal block, both programs: K_own K_own^T, Q_own K_own^T
    q_rows = q_ptr + b64 * s_qb + own[:, None] * s_qn + h * s_qh  # [HALF, 1]
    k_rows = k_ptr + b64 * s_kb + own[:, None] * s_kn + h * s_kh  # [HALF, 1]
    kk, qk, k_rn, q_rn = _half_grams(q_rows, k_rows, k_rows, own_real, own_real, K, HALF, BK, L2NORM, PRECISION,
                                     QK16, DOT16)  # [HALF, HALF] x2, [HALF] x2
    if L2NORM:
        kk = kk * k_rn[:, None] * k_rn[None, :]
        qk = qk * q_rn[:, None] * k_rn[None, :]
        first = (own * 0 + hv) % (HV // H) == 0  # [HALF] one program of the group writes the q/k scalars
        tl.store(k_rnorm_ptr + (b64 * N + own) * H + h, k_rn, mask=(own < N) & first)
        tl.store(q_rnorm_ptr + (b64 * NP + own) * H + h, q_rn, mask=(own < NP) & first)
    g, beta = _gates(g_ptr + r0 * s_gn, beta_ptr + r0 * s_bn, a_log_ptr, dt_bias_ptr, b64, hv, n_b - r0, s_gb, s_gn,
                     s_gh, s_bb, s_bn, s_bh, HALF, GATED, BETA_TWO)  # [HALF] each, this program's rows
    g_up, _ = _gates(g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, b64, hv, n_b, s_gb, s_gn, s_gh, s_bb, s_bn, s_bh,
                     HALF, GATED, BETA_TWO)  # [HALF] the upper half's
    log_gamma_up = tl.sum(tl.where(_ancestor_block(words_ptr, b64, n_b, N, upper, upper, W, WORD_BITS),
                                   g_up[None, :], 0.0), axis=1)  # [HALF] log Gamma of the upper half
    anc_up = _ancestor_block(words_ptr, b64, n_b, N, own, upper, W, WORD_BITS) & (lower == 1)  # [HALF, HALF]
    anc = _ancestor_block(words_ptr, b64, n_b, N, own, own, W, WORD_BITS)  # [HALF, HALF] M[own, own]
    log_gamma = (tl.sum(tl.where(anc, g[None, :], 0.0), axis=1)
                 + tl.sum(tl.where(anc_up, g_up[None, :], 0.0), axis=1))  # [HALF] log Gamma_i over path(i)
    tl.store(log_gamma_ptr + (b64 * N + own) * HV + hv, log_gamma, mask=own < N)
    decay = tl.exp(tl.where(anc, log_gamma[:, None] - log_gamma[None, :], float("-inf")))  # [HALF, HALF] D[own, own]
    _store_scratch(qkd_ptr + _scratch_block(b64, hv, HV, NP, own, own), qk * decay, QKD_SCALE, PRECISION, SCRATCH16)
    strict = anc & (own[:, None] != own[None, :])  # [HALF, HALF] M°[own, own]
    neg_a = tl.where(strict, -(beta[:, None] * kk * decay), 0.0)  # [HALF, HALF] -A[own, own]
    levels = _doubling_levels(depth_ptr, b64, N, n_b, NP, LOG_NP)
    t_own = _inverse_unit_lower(neg_a, levels, HALF, PRECISION, PRECISION != "ieee")  # [HALF, HALF] T[own, own]
    _store_scratch(tb_ptr + _scratch_block(b64, hv, HV, NP, own, own), t_own * beta[None, :], TB_SCALE, PRECISION,
                   SCRATCH16)
    ready = ready_ptr + b64 * HV + hv
    if lower == 0:  # the blocks right of the diagonal one: zeros
        zeros = tl.zeros([HALF, HALF], tl.float32)
        _store_scratch(qkd_ptr + _scratch_block(b64, hv, HV, NP, upper, HALF + upper), zeros, QKD_SCALE, PRECISION,
                       SCRATCH16)
        _store_scratch(tb_ptr + _scratch_block(b64, hv, HV, NP, upper, HALF + upper), zeros, TB_SCALE, PRECISION,
                       SCRATCH16)
        tl.debug_barrier()  # every thread's stores are issued before the (one-thread) release below
        tl.atomic_xchg(ready, 1, sem="release", scope="gpu")
    else:  # the block left of the diagonal one: K_l K_u^T, Q_l K_u^T (a second pass over q / k, from L2)
        ku_rows = k_ptr + b64 * s_kb + upper[:, None] * s_kn + h * s_kh  # [HALF, 1]
        kk_up, qk_up, ku_rn, _ = _half_grams(q_rows, k_rows, ku_rows, own_real, upper < n_b, K, HALF, BK, L2NORM,
                                             PRECISION, QK16, DOT16)  # [HALF, HALF] x2, [HALF] the upper keys'
        if L2NORM:
            kk_up = kk_up * k_rn[:, None] * ku_rn[None, :]
            qk_up = qk_up * q_rn[:, None] * ku_rn[None, :]
        decay_up = tl.exp(tl.where(anc_up, log_gamma[:, None] - log_gamma_up[None, :], float("-inf")))  # D[l, u]
        _store_scratch(qkd_ptr + _scratch_block(b64, hv, HV, NP, own, upper), qk_up * decay_up, QKD_SCALE,
                       PRECISION, SCRATCH16)
        neg_a_up = -(beta[:, None] * kk_up * decay_up)  # [HALF, HALF] -A[l, u] (decay_up is 0 off the ancestors)
        c = tl.dot(_tf32_round(t_own, PRECISION), _tf32_round(neg_a_up, PRECISION),
                   input_precision=PRECISION)  # [HALF, HALF] T_ll (-A_lu)
        # C goes through global memory (L2) to the product below: a product whose result feeds another one gets
        # warps [num_warps, 1] from Triton (3.6), which at 8 warps over-cover the 64 rows, and that form of this
        # kernel read shared memory out of range on the H200 (compute-sanitizer's memcheck found it)
        c_tile = c_ptr + (b64 * HV + hv) * (HALF * HALF) + upper[:, None] * HALF + upper[None, :]  # [HALF, HALF]
        tl.store(c_tile, c)
        tl.debug_barrier()  # the block's stores of C before its loads of it
        while tl.atomic_add(ready, 0, sem="acquire", scope="gpu") == 0:
            pass
        c = tl.load(c_tile, cache_modifier=".cg")  # [HALF, HALF] T_ll (-A_lu)
        tb_uu = _scratch_value(tl.load(tb_ptr + _scratch_block(b64, hv, HV, NP, upper, upper), cache_modifier=".cg"),
                               TB_SCALE, PRECISION, SCRATCH16)  # [HALF, HALF] T_uu diag(beta_u)
        tb_lu = tl.dot(_tf32_round(c, PRECISION), tb_uu, input_precision=PRECISION)  # [HALF, HALF] T_lu diag(beta_u)
        _store_scratch(tb_ptr + _scratch_block(b64, hv, HV, NP, own, upper), tb_lu, TB_SCALE, PRECISION, SCRATCH16)


@triton.jit
def _half_grams(q_rows, k_rows, kc_rows, real, col_real, K: tl.constexpr, HALF: tl.constexpr, BK: tl.constexpr,
                L2NORM: tl.constexpr, PRECISION: tl.constexpr, QK16: tl.constexpr, DOT16: tl.constexpr):
    """One pass over K for :func:`_gdn_tree_solve_rows_kernel`: ``K K_c^T`` and ``Q K_c^T`` ``[HALF, HALF]`` of
    the rows at ``q_rows`` / ``k_rows`` against the keys at ``kc_rows`` (``[HALF, 1]`` pointers; ``real`` /
    ``col_real`` their nodes below the tree's size), unnormalised, and with ``L2NORM`` the reciprocal norms ``[HALF]``
    of the columns' keys and of the rows' queries (sums of squares of the loaded values, the same in both programs)."""
    kk = tl.zeros([HALF, HALF], dtype=tl.float32)
    qk = tl.zeros([HALF, HALF], dtype=tl.float32)
    kc_sq = tl.zeros([HALF], dtype=tl.float32)
    q_sq = tl.zeros([HALF], dtype=tl.float32)
    for k0 in range(0, K, BK):
        kc = k0 + tl.arange(0, BK)  # [BK]
        q_raw = tl.load(q_rows + kc[None, :], mask=real[:, None], other=0.0)  # [HALF, BK] input dtype
        k_raw = tl.load(k_rows + kc[None, :], mask=real[:, None], other=0.0)  # [HALF, BK]
        kc_raw = tl.load(kc_rows + kc[None, :], mask=col_real[:, None], other=0.0)  # [HALF, BK]
        q_c = q_raw.to(tl.float32)
        k_c = k_raw.to(tl.float32)
        kc_c = kc_raw.to(tl.float32)
        if L2NORM:
            kc_sq += tl.sum(kc_c * kc_c, axis=1)
            q_sq += tl.sum(q_c * q_c, axis=1)
        kk, qk = _cross_products(q_raw, k_raw, kc_raw, _round_qk(q_c, PRECISION, QK16), _round_qk(k_c, PRECISION, QK16),
                                 _round_qk(kc_c, PRECISION, QK16), kk, qk, PRECISION, DOT16)
    kc_rn = tl.where(col_real, 1.0 / tl.sqrt(kc_sq + 1e-6), 0.0)  # [HALF]
    q_rn = tl.where(real, 1.0 / tl.sqrt(q_sq + 1e-6), 0.0)  # [HALF]
    return kk, qk, kc_rn, q_rn


