r"""Device building blocks of the GDN tree verify, shared by the solve, the apply and the one-kernel verify.

Per value head, with the inclusive ancestor mask ``M``, ``log Gamma = M g`` and ``D_ij = M_ij exp(log Gamma_i -
log Gamma_j)`` (masked to ``-inf`` before the ``exp``)::

    A     = diag(beta) (K K^T ⊙ D ⊙ M°)                         strictly lower triangular
    (I + A)^{-1} = prod_{l < L} (I + (-A)^(2^l))                 L = bit_length(max depth): A^(depth + 1) = 0

This module holds the tf32 rounding, the Gram products, the ancestor mask read from the bitsets, the gates, the path
decays and the unit-lower inverse by doubling (whole tile or by diagonal halves). The schedule the kernels run is
checked against the reference in :mod:`lumotree.proofs`.
"""

from __future__ import annotations

import triton
import triton.language as tl

#: The lowest log decay the kernels hold (a decay of exactly 0 in fp32: ``exp(-128) = 0`` there, as ``exp(-inf)``):
#: a gate below it, ``-inf`` included, is raised to it, so that every path sum of ``g`` stays finite and a difference
#: of two of them is never ``-inf - (-inf)``. Its cost: ``2^-24 * 128`` of absolute error in the path sums below it.
LOG_DECAY_FLOOR = tl.constexpr(-128.0)


@triton.jit
def _tf32_round(x, PRECISION: tl.constexpr):
    """Round fp32 to the nearest tf32 before a tf32 tensor-core product: the hardware truncates the low 13 mantissa
    bits, a bias that grows over K = 128 products (measured 4e-3 relative error at N = 64 against 5e-4 rounded)."""
    if PRECISION == "tf32":
        x = ((x.to(tl.int32, bitcast=True) + 0x1000) & -8192).to(tl.float32, bitcast=True)
    return x


@triton.jit
def _round_qk(x, PRECISION: tl.constexpr, QK16: tl.constexpr):
    """q or k (fp32 after the load) ready for a tf32 product: 16-bit inputs (``QK16``: bf16 / fp16, whose values
    tf32 holds exactly) as they are, fp32 inputs rounded (:func:`_tf32_round`)."""
    if not QK16:
        x = _tf32_round(x, PRECISION)
    return x


# fp16 scratch (KernelConfig.scratch16): |TB| <= 4 and |QKD| <= 1 with L2-normalised keys and queries, beta in
# [0, 2] and decays <= 1 (each entry of QKD is a product of two unit vectors' dot product and a decay; TB's rows
# sum geometric series of beta-scaled dot products of unit keys); these powers of two keep them 16x below fp16's
# largest finite value and move its subnormals (where it holds fewer than tf32's 10 mantissa bits) below 6e-8.
TB_SCALE = tl.constexpr(1024.0)
QKD_SCALE = tl.constexpr(4096.0)


@triton.jit
def _store_scratch(ptr, x, SCALE: tl.constexpr, PRECISION: tl.constexpr, SCRATCH16: tl.constexpr):
    """Store an ``[NP, NP]`` operand of the apply's tf32 products. ``SCRATCH16``: rounded to tf32 (10 mantissa
    bits, as the apply would round it) and times ``SCALE`` (exact), in fp16, which then holds it exactly while
    ``|x| SCALE`` lies in fp16's normal range; else as it is (fp32)."""
    if SCRATCH16:
        tl.store(ptr, (_tf32_round(x, PRECISION) * SCALE).to(tl.float16))
    else:
        tl.store(ptr, x)


@triton.jit
def _scratch_value(x, SCALE: tl.constexpr, PRECISION: tl.constexpr, SCRATCH16: tl.constexpr):
    """An operand stored by :func:`_store_scratch` (``x`` as loaded), fp32 and ready for a product at
    ``PRECISION``."""
    if SCRATCH16:
        x = x.to(tl.float32) * (1.0 / SCALE)  # already tf32-exact
    else:
        x = _tf32_round(x, PRECISION)
    return x


@triton.jit
def _gram_products(q_raw, k_raw, q_c, k_c, kk, qk, PRECISION: tl.constexpr, DOT16: tl.constexpr):
    """``K K^T`` and ``Q K^T`` accumulated over one K chunk (:func:`_cross_products` with the same rows' keys on
    the right)."""
    return _cross_products(q_raw, k_raw, k_raw, q_c, k_c, k_c, kk, qk, PRECISION, DOT16)


@triton.jit
def _cross_products(q_raw, k_raw, kc_raw, q_c, k_c, kc_c, kk, qk, PRECISION: tl.constexpr, DOT16: tl.constexpr):
    """``K K_c^T`` and ``Q K_c^T`` accumulated over one K chunk, ``K_c`` the keys of the columns' nodes: ``DOT16``
    (16-bit q / k, tensor-core modes) as 16-bit products of the tiles as loaded (exact products, fp32 sums: what
    tf32 computes on these values, without the conversion before the product), else on the fp32 tiles ``q_c, k_c,
    kc_c`` at ``PRECISION``."""
    if DOT16:
        kk = tl.dot(k_raw, tl.trans(kc_raw), kk)
        qk = tl.dot(q_raw, tl.trans(kc_raw), qk)
    else:
        kk = tl.dot(k_c, tl.trans(kc_c), kk, input_precision=PRECISION)
        qk = tl.dot(q_c, tl.trans(kc_c), qk, input_precision=PRECISION)
    return kk, qk


@triton.jit
def _diagonal(m, NP: tl.constexpr):
    """The diagonal ``[NP]`` of a square ``[NP, NP]`` tile."""
    nodes = tl.arange(0, NP)
    return tl.sum(tl.where(nodes[:, None] == nodes[None, :], m, 0.0), axis=1)


@triton.jit
def _ancestor_mask(words_ptr, b64, n_b, N, W: tl.constexpr, NP: tl.constexpr, WORD_BITS: tl.constexpr,
                   WORD_VECTORS: tl.constexpr):
    """Inclusive ancestor mask ``M [NP, NP]`` of one request (padding rows and columns False).
    ``WORD_VECTORS``: read the words as W ``[NP]`` vectors selected by ``j // WORD_BITS`` (no ``[NP, NP]`` tile of
    64-bit pointers) instead of one ``[NP, NP]`` gather."""
    nodes = tl.arange(0, NP)  # [NP]
    real = nodes < n_b  # [NP] padding rows are never read
    # M[i, j] = (words[i][j // WORD_BITS] >> (j % WORD_BITS)) & 1 (:func:`_ancestor_block`; keep them identical)
    if WORD_VECTORS:  # per-head kernel at N = 64, 8 warps: 188 instead of 217 registers
        word = tl.zeros([NP, NP], dtype=tl.int32)  # [NP, NP] words[i][j // WORD_BITS]
        for w in tl.static_range(W):
            word_w = tl.load(words_ptr + (b64 * N + nodes) * W + w, mask=real, other=0)  # [NP] words[i][w]
            word = tl.where(nodes[None, :] // WORD_BITS == w, word_w[:, None], word)
        word = tl.where(real[None, :], word, 0)
        anc = ((word >> (nodes[None, :] % WORD_BITS)) & 1) != 0  # [NP, NP] M
    else:
        anc = _ancestor_block(words_ptr, b64, n_b, N, nodes, nodes, W, WORD_BITS)  # [NP, NP] M
    return anc


@triton.jit
def _ancestor_block(words_ptr, b64, n_b, N, rows, cols, W: tl.constexpr, WORD_BITS: tl.constexpr):
    """The block ``M[rows, cols]`` of one request's inclusive ancestor mask (padding rows and columns False), one
    gather of the tree's bitsets: ``M[i, j] = (words[i][j // WORD_BITS] >> (j % WORD_BITS)) & 1``, the index
    arithmetic of lumotree.reference.tree.mask_bit (lumotree.proofs checks that arithmetic with Z3; keep it
    identical)."""
    word = tl.load(words_ptr + (b64 * N + rows[:, None]) * W + cols[None, :] // WORD_BITS,
                   mask=(rows < n_b)[:, None] & (cols < n_b)[None, :], other=0)  # [rows, cols] int32
    return ((word >> (cols[None, :] % WORD_BITS)) & 1) != 0  # [rows, cols]


@triton.jit
def _gates(g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, b64, hv, n_b, s_gb, s_gn, s_gh, s_bb, s_bn, s_bh,
           NP: tl.constexpr, GATED: tl.constexpr, BETA_TWO: tl.constexpr):
    """Log decay ``g`` and write strength ``beta`` ``[NP]`` of one (request, value head), zero on padding nodes;
    ``GATED``: from the raw projections (``g = -exp(A_log) softplus(a + dt_bias)``, ``beta = sigmoid(b)``, times 2
    with ``BETA_TWO``)."""
    loaded = _load_gates(g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, b64, hv, n_b, s_gb, s_gn, s_gh, s_bb, s_bn, s_bh,
                         NP, GATED)
    return _gate_values(loaded, n_b, NP, GATED, BETA_TWO)


@triton.jit
def _load_gates(g_ptr, beta_ptr, a_log_ptr, dt_bias_ptr, b64, hv, n_b, s_gb, s_gn, s_gh, s_bb, s_bn, s_bh,
                NP: tl.constexpr, GATED: tl.constexpr):
    """The loads of :func:`_gates`, values as stored (their first use waits for them): the two ``[NP]`` rows and,
    with ``GATED``, ``A_log`` and ``dt_bias`` of value head ``hv``."""
    nodes = tl.arange(0, NP)  # [NP]
    real = nodes < n_b  # [NP]
    row_a = tl.load(g_ptr + b64 * s_gb + nodes * s_gn + hv * s_gh, mask=real, other=0.0)  # [NP] g or a
    row_b = tl.load(beta_ptr + b64 * s_bb + nodes * s_bn + hv * s_bh, mask=real, other=0.0)  # [NP] beta or b
    if GATED:
        loaded = (row_a, row_b, tl.load(a_log_ptr + hv), tl.load(dt_bias_ptr + hv))
    else:
        loaded = (row_a, row_b, 0.0, 0.0)
    return loaded


@triton.jit
def log_decay(x, a_log):
    """``g = -exp(A_log) softplus(x)`` (``x = a + dt_bias``; softplus linear above 20), never NaN and never below
    :data:`LOG_DECAY_FLOOR`: where ``exp(A_log)`` overflows fp32 it is ``-exp(A_log + log softplus(x))`` (no
    ``inf * 0``), and a decay that fp32 rounds to 0 (``g <= -104``, ``-inf`` included) is held at the floor, whose
    ``exp`` is 0 too, so that path sums of ``g`` stay finite."""
    softplus = tl.where(x > 20.0, x, tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x))))
    log_softplus = tl.where(x < -15.0, x, tl.log(tl.maximum(softplus, 1e-30)))  # log softplus(x) = x - e^x / 2 + ...
    g = tl.where(a_log > 88.0, -tl.exp(a_log + log_softplus), -tl.exp(a_log) * softplus)
    return floor_log_decay(g)


@triton.jit
def floor_log_decay(g):
    """``max(g, LOG_DECAY_FLOOR)``: the same decay in fp32 (``exp`` of either is 0 below -104), a finite path sum."""
    return tl.where(g > LOG_DECAY_FLOOR, g, LOG_DECAY_FLOOR)


@triton.jit
def _gate_values(loaded, n_b, NP: tl.constexpr, GATED: tl.constexpr, BETA_TWO: tl.constexpr):
    """``g, beta [NP]`` from :func:`_load_gates`'s values (``g`` through :func:`log_decay` /
    :func:`floor_log_decay`)."""
    real = tl.arange(0, NP) < n_b  # [NP]
    if GATED:
        x = loaded[0].to(tl.float32) + loaded[3].to(tl.float32)
        g = tl.where(real, log_decay(x, loaded[2].to(tl.float32)), 0.0)
        beta = tl.sigmoid(loaded[1].to(tl.float32))
        if BETA_TWO:
            beta = 2.0 * beta
        beta = tl.where(real, beta, 0.0)
    else:
        g = floor_log_decay(loaded[0].to(tl.float32))
        beta = loaded[1].to(tl.float32)
    return g, beta


@triton.jit
def _doubling_levels(depth_ptr, b64, N, n_b, NP: tl.constexpr, LOG_NP: tl.constexpr):
    """L = bit_length(max depth) of one request's tree: the number of factors of :func:`_inverse_unit_lower`."""
    return _levels_of(_load_depth(depth_ptr, b64, N, n_b, NP), LOG_NP)


@triton.jit
def _load_depth(depth_ptr, b64, N, n_b, NP: tl.constexpr):
    """The depths ``[NP]`` of one request's nodes (padding 0), as loaded: :func:`_levels_of` uses them."""
    nodes = tl.arange(0, NP)
    return tl.load(depth_ptr + b64 * N + nodes, mask=nodes < n_b, other=0)  # [NP]


@triton.jit
def _levels_of(depth, LOG_NP: tl.constexpr):
    """bit_length of the largest of the depths ``[NP]``."""
    depth_max = tl.max(depth, axis=0)
    levels = 0
    for e in tl.static_range(LOG_NP):
        levels += (depth_max >= (1 << e)).to(tl.int32)
    return levels


@triton.jit
def _path_decay(anc, gate_loads, n_b, NP: tl.constexpr, GATED: tl.constexpr, BETA_TWO: tl.constexpr):
    """From :func:`_load_gates`'s values: ``log Gamma [NP]`` (g summed over each node's path), ``Gamma``, the decay
    ``D [NP, NP]`` (``Gamma_i / Gamma_j`` for j an ancestor of i, else 0) and ``beta``."""
    g, beta = _gate_values(gate_loads, n_b, NP, GATED, BETA_TWO)  # [NP] each
    log_gamma = tl.sum(tl.where(anc, g[None, :], 0.0), axis=1)  # [NP] log Gamma_i: g summed over path(i)
    decay = tl.exp(tl.where(anc, log_gamma[:, None] - log_gamma[None, :], float("-inf")))  # [NP, NP] D
    return log_gamma, tl.exp(log_gamma), decay, beta


@triton.jit
def _inverse_unit_lower(neg_a, levels, NP: tl.constexpr, PRECISION: tl.constexpr, OVERLAP: tl.constexpr):
    """``T = (I + A)^{-1} = prod_{l < L} (I + (-A)^(2^l))``, ``L = levels`` = bit_length(max depth)
    (:func:`_doubling_levels`; A^(depth + 1) = 0).

    With ``P_l = (-A)^(2^l)`` and ``T_l = prod_{m < l} (I + P_m)``: ``T_1 = I + P_0``, ``T_(l+1) = T_l + T_l P_l``,
    ``P_(l+1) = P_l P_l``. ``OVERLAP``: step l forms ``T_(l+1)`` and ``P_(l+1)`` from ``T_l`` and ``P_l`` alone (two
    independent products, so the chain of dependent products is L long instead of 2 (L - 1)); else each step squares
    first and multiplies ``T`` by the new power. The same products on the same operands either way: bit for bit the
    same result. On the H200 (B = 1, N = 64, tf32) the overlapped form made the split pipeline's solve 2.1 us faster
    and the one-kernel form, which holds more tiles at that point (255 registers and spills), 1.7 us slower. In
    ``ieee`` mode (products on the CUDA cores) the split solve squares first too: there the overlapped form compiled
    to 32 registers and ~8 KB of stack (Triton 3.6 and 3.9, sm_90), and B = 64 took 5141.5 against 1243.3 us."""
    nodes = tl.arange(0, NP)
    t_inv = tl.where(nodes[:, None] == nodes[None, :], 1.0, neg_a)  # [NP, NP] T_1 = I - A (A has a zero diagonal)
    if not OVERLAP:
        power = neg_a  # [NP, NP] P_l
        for _ in range(1, levels):
            power = _tf32_round(power, PRECISION)
            power = tl.dot(power, power, input_precision=PRECISION)
            t_inv = tl.dot(_tf32_round(t_inv, PRECISION), _tf32_round(power, PRECISION), t_inv,
                           input_precision=PRECISION)
    elif levels > 1:
        power = _tf32_round(neg_a, PRECISION)  # [NP, NP] P_0
        if levels >= 2:  # always true here: the product in a region of its own, whose result leaves through the
            # region's yield, so Triton (3.6) does not see it feed the products below and give it [num_warps, 1]
            # warps (at 8 warps that over-covers a 64-row tile)
            power = tl.dot(power, power, input_precision=PRECISION)  # [NP, NP] P_1
        for _ in range(2, levels):  # T_2 .. T_(L-1) and P_2 .. P_(L-1)
            power = _tf32_round(power, PRECISION)
            t_next = tl.dot(_tf32_round(t_inv, PRECISION), power, t_inv, input_precision=PRECISION)  # T_(l+1)
            power = tl.dot(power, power, input_precision=PRECISION)  # P_(l+1)
            t_inv = t_next
        t_inv = tl.dot(_tf32_round(t_inv, PRECISION), _tf32_round(power, PRECISION), t_inv,
                       input_precision=PRECISION)  # T_L
    return t_inv


@triton.jit
def _inverse_unit_lower_halves(neg_a, levels, NP: tl.constexpr, PRECISION: tl.constexpr, OVERLAP: tl.constexpr):
    """:func:`_inverse_unit_lower` by diagonal halves: with ``A`` split into ``[NP/2, NP/2]`` blocks (``A_12 = 0``:
    ancestors come first), ``(I + A)^{-1} = [[T_11, 0], [-T_22 A_21 T_11, T_22]]``, ``T_ii = (I + A_ii)^{-1}``, each
    by doubling with the same ``L`` (a diagonal block holds paths of the tree: ``A_ii^(depth + 1) = 0``). Per step
    four ``[NP/2]^3`` products of the halves instead of two ``NP^3`` ones: a quarter of the doubling's work, and
    ``[NP/2, NP/2]`` tiles in registers."""
    HALF: tl.constexpr = NP // 2
    quads = tl.permute(tl.reshape(neg_a, [2, HALF, 2, HALF]), [1, 3, 0, 2])  # [HALF, HALF, 2 row halves, 2 col]
    left, right = tl.split(quads)  # [HALF, HALF, 2] the column halves
    neg_a11, neg_a21 = tl.split(left)  # [HALF, HALF] each
    _, neg_a22 = tl.split(right)  # [HALF, HALF] (the upper right block is zero)
    t11 = _inverse_unit_lower(neg_a11, levels, HALF, PRECISION, OVERLAP)  # [HALF, HALF]
    t22 = _inverse_unit_lower(neg_a22, levels, HALF, PRECISION, OVERLAP)  # [HALF, HALF]
    t22_a21 = tl.dot(_tf32_round(t22, PRECISION), _tf32_round(neg_a21, PRECISION), input_precision=PRECISION)
    t21 = tl.dot(_tf32_round(t22_a21, PRECISION), _tf32_round(t11, PRECISION), input_precision=PRECISION)
    zero = tl.zeros([HALF, HALF], dtype=tl.float32)
    blocks = tl.join(tl.join(t11, t21), tl.join(zero, t22))  # [HALF, HALF, 2 row halves, 2 column halves]
    return tl.reshape(tl.permute(blocks, [2, 0, 3, 1]), [NP, NP])  # [NP, NP]


@triton.jit
def _inverse(neg_a, levels, NP: tl.constexpr, PRECISION: tl.constexpr, OVERLAP: tl.constexpr,
             HALVES: tl.constexpr):
    """``(I + A)^{-1}`` from ``-A``: :func:`_inverse_unit_lower_halves` with ``HALVES``, else
    :func:`_inverse_unit_lower` on the whole tile."""
    if HALVES:
        t_inv = _inverse_unit_lower_halves(neg_a, levels, NP, PRECISION, OVERLAP)
    else:
        t_inv = _inverse_unit_lower(neg_a, levels, NP, PRECISION, OVERLAP)
    return t_inv




@triton.jit
def _scratch_tile(b64, hv, HV: tl.constexpr, NP: tl.constexpr):
    """Offsets ``[NP, NP]`` of (request, value head hv)'s tile in the solve's ``[B * HV, NP, NP]`` scratch."""
    nodes = tl.arange(0, NP)
    return _scratch_block(b64, hv, HV, NP, nodes, nodes)


@triton.jit
def _scratch_block(b64, hv, HV: tl.constexpr, NP: tl.constexpr, rows, cols):
    """Offsets ``[rows, cols]`` of a block of (request, value head hv)'s ``[NP, NP]`` scratch tile."""
    return (b64 * HV + hv) * (NP * NP) + rows[:, None] * NP + cols[None, :]


@triton.jit
def _head_operands(anc, strict, kk, qk, g, beta, log_gamma_ptr, qkd_ptr, b64, hv, N, HV: tl.constexpr,
                   NP: tl.constexpr, PRECISION: tl.constexpr, SCRATCH16: tl.constexpr):
    """One value head's part of the solve before its doubling: stores ``log Gamma`` (g summed over each node's path)
    and ``QKD = Q K^T ⊙ D``, returns ``-A = -(diag(beta) K K^T ⊙ D ⊙ M°)`` ``[NP, NP]``."""
    nodes = tl.arange(0, NP)
    log_gamma = tl.sum(tl.where(anc, g[None, :], 0.0), axis=1)  # [NP] log Gamma_i: g summed over path(i)
    tl.store(log_gamma_ptr + (b64 * N + nodes) * HV + hv, log_gamma, mask=nodes < N)
    decay = tl.exp(tl.where(anc, log_gamma[:, None] - log_gamma[None, :], float("-inf")))  # [NP, NP] D
    _store_scratch(qkd_ptr + _scratch_tile(b64, hv, HV, NP), qk * decay, QKD_SCALE, PRECISION, SCRATCH16)
    return tl.where(strict, -(beta[:, None] * kk * decay), 0.0)  # [NP, NP] -A


@triton.jit
def _real_rows(x, real, HAS_NUM: tl.constexpr):
    """A tile loaded through a descriptor with its padding nodes' rows set to zero (their memory may hold anything;
    rows past N come back zero-filled). Without sizes every row up to N is real."""
    if HAS_NUM:
        x = tl.where(real[:, None], x, 0.0)
    return x
