r"""Gated DeltaNet on draft trees: path-parallel verification with token-level factors, and the in-place state commit.

Verification computes, for a batch of requests each with its own tree (up to 128 nodes, sizes may differ), every
node's output and the token-level factors from the committed state ``S0`` read once, without forming a per-node state
(DESIGN.md §2). Per value head, with the inclusive ancestor mask ``M``, ``log Gamma = M g``,
``D_ij = M_ij exp(log Gamma_i - log Gamma_j)`` (masked to ``-inf`` before the ``exp``)::

    A     = diag(beta) (K K^T ⊙ D ⊙ M°)                         strictly lower triangular
    Delta = (I + A)^{-1} diag(beta) (V - diag(Gamma) K S0)       (I + A)^{-1} = prod_{l < L} (I + (-A)^(2^l))
    O     = scale (diag(Gamma) Q S0 + (Q K^T ⊙ D) Delta)

``A`` is nilpotent (``A^(depth + 1) = 0``), so ``L = bit_length(max depth)`` doubling factors, each one or two
``[N, N]`` matrix products on the tensor cores (or FMA units in ``ieee`` mode), invert ``I + A`` exactly. Past N = 64
the split pipeline inverts the two diagonal ``[N/2, N/2]`` blocks so and forms the block below them from both
(``(I + A)^{-1}_21 = -T_22 A_21 T_11``): a quarter of the doubling's work; with ``KernelConfig.row_halves`` (the
default there) two programs per value head do so, one per half of the rows (:func:`_gdn_tree_solve_rows_kernel`).

The commit rebuilds the accepted node's state in place in the pool:
``S_a = Gamma_a S0 + sum_{j in path(a)} (Gamma_a / Gamma_j) k_j delta_j^T``.

Grid of both kernels: one program per (request, value head, block of V columns). Verify loads its ``S0`` tile
``[K, BV]`` once in ``BK``-row chunks and forms ``K K^T``, ``Q K^T``, ``K S0`` and ``Q S0`` in the same pass (with the
L2 norms of q and k, applied afterwards as row/column scales). Layouts as flash-linear-attention:
``q, k: [B, N, H, K]``, ``v: [B, N, HV, V]``, ``g, beta: [B, N, HV]``; fp32 state pool ``[P, HV, K, V]`` addressed
by ``slots: [B]``.

Tree metadata (``words``: inclusive ancestor bitsets, ``depth``) is built once per step and shared by every layer
(:func:`tree_meta`, which runs :func:`lumotree.optimized.tree_attention.tree_metadata`). The kernels read the mask with
exactly the arithmetic of :func:`lumotree.reference.tree.mask_bit`: ``(words[i][j // 32] >> (j % 32)) & 1``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ._checks import (
    FLOAT_DTYPES,
    MAX_NODES,
    check_finite_nodes,
    check_node_index,
    check_num_nodes,
    check_sizes,
    check_range_nodes,
    check_scalar,
    check_slots,
    check_tensor,
    check_tree_rows,
    node_mask,
    tma_possible,
)
from .pdl import allow_dependents, pdl_supported, prefetch_l2
from .tree_attention import PATH_BLOCK, TreeMeta, accepted_path, path_chunk, tree_metadata, tree_size

__all__ = [
    "TreeFactors",
    "TreeMeta",
    "OutputGate",
    "GATE_PIECE",
    "KernelConfig",
    "PRECISIONS",
    "tree_meta",
    "gdn_tree_verify",
    "gdn_tree_verify_gated",
    "gdn_tree_commit",
    "verify_config",
    "commit_config",
]

WORD_BITS = 32  # lumotree.reference.tree.WORD_BITS
GATE_PIECE = 16  # columns per piece of the output's sums of squares (OutputGate.parts)
PRECISIONS = ("ieee", "tf32x3", "tf32")
RANK_ONE_BLOCK = 4  # commit with KernelConfig.rank_one: path nodes whose loads are in flight together


class TreeFactors(NamedTuple):
    """Token-level factors of a verified batch of trees: all a commit needs besides ``S0``.

    ``delta: [B, N, HV, V]`` solved update vectors, fp32 (fp16 from the fused verify: the values its outputs
    used); ``log_gamma: [B, N, HV]`` fp32 ``log Gamma_i`` (path sum of g); ``k: [B, N, H, K]`` the keys as passed to
    verify (a reference, not a copy); ``k_rnorm: [B, N, H]`` fp32 ``rsqrt(|k_i|^2 + 1e-6)`` when verify normalised
    k in the kernel, else None. The keys used are ``k * k_rnorm[..., None]``. Padding nodes hold zeros.
    """

    delta: torch.Tensor
    log_gamma: torch.Tensor
    k: torch.Tensor
    k_rnorm: torch.Tensor | None


class OutputGate(NamedTuple):
    """The gated RMSNorm after a GDN layer, ``weight * o * rsqrt(mean(o^2) + eps) * silu(z)`` per (node, value
    head), half done by the verify kernel: with ``z: [B, N, HV, V]`` (the output gate; strided views with a
    contiguous last dim), ``weight: [V]`` and ``parts: [B, N, HV, V // GATE_PIECE]`` fp32 contiguous (written), the
    kernel stores ``o' = round(weight * round(o) * silu(z))`` in place of ``o`` (zeros on padding nodes) and, in
    ``parts``, the sums of squares of ``round(o)`` in pieces (``parts.sum(-1)`` = each head's sum of squares; how
    the kernel's V blocks share it out over the :data:`GATE_PIECE`-column slots is theirs). The norm is then
    ``o' * rsqrt(sum(parts) / V + eps)``: the next projection applies that factor per head to its product
    (:class:`~lumotree.optimized.gemv.RowNorm` with ``parts`` viewed as ``[B N, HV, V // GATE_PIECE]``), so the
    separate norm launch goes. ``round(o)`` is what the norm would read from the stored output; the rounding of
    the result moves from after the factor to before it (the same relative size)."""

    z: torch.Tensor
    weight: torch.Tensor
    parts: torch.Tensor


class KernelConfig(NamedTuple):
    """Launch parameters of verify and commit (:func:`verify_config`, :func:`commit_config` pick them per shape;
    the measurements behind each default: docs/gdn-kernels-log.md, "Where the defaults come from").

    Attributes:
        block_v: V columns per program (verify's apply or fused kernel, commit).
        block_k: K rows per chunk; in the commit, state rows per program (K / block_k programs share a (request,
            value head, V block)).
        num_warps: warps of the apply, the fused kernel or the commit.
        num_stages: software-pipelining stages of their K loops.
        split: verify as two kernels (a per-(request, value head) solve of the ``[N, N]`` system, then a
            per-V-block apply over ``S0``) instead of one fused kernel.
        solve_warps: warps of the split solve.
        word_vectors: read the ancestor bitsets as W ``[N]`` vectors instead of an ``[N, N]`` gather.
        solve_heads: value heads of one GVA group per solve program (``K K^T``, ``Q K^T`` formed once for them;
            a divisor of ``HV // H``).
        solve_stages: stages of the solve's K loop (0: ``num_stages``).
        dot16: with 16-bit q / k in a tensor-core mode, ``K K^T`` and ``Q K^T`` as 16-bit products of the loaded
            tiles (exact products, fp32 sums: :func:`_gram_products`).
        pdl: the fused kernel may be a programmatic dependent launch that prefetches ``S0`` before its wait
            (when the caller passes ``gdn_tree_verify(pdl=True)``).
        apply_pdl: the split apply is a programmatic dependent launch behind the solve, which signals at its
            start; the apply's pass over ``S0`` runs under the solve's tail and waits before reading its outputs.
        scratch16: the solve hands ``TB`` and ``QKD`` to the apply in fp16 scaled by a power of two
            (:func:`_store_scratch`; ``tf32`` mode with q / k normalised in the kernel): the values the apply's
            tf32 products would read from fp32 tiles, in half the memory.
        max_registers: a register cap (ptxas ``maxnreg``; 0: the compiler's choice) for the kernel that streams
            the state: the split apply in a verify config, the commit in a commit config.
        early_signal: with ``gdn_tree_verify(launch_dependents=True)`` the last verify kernel lets its PDL
            successor launch at its start; ``False``: only as its programs exit.
        rank_one: the commit adds the path's terms as fp32 outer products on the CUDA cores, ``RANK_ONE_BLOCK``
            nodes' loads at a time, instead of a ``tl.dot`` of ``PATH_BLOCK`` gathered nodes.
        tma: the split apply's, the fused kernel's or the commit's tiles through tensor descriptors (Hopper's
            TMA) where the tensors allow it (:func:`_tma_descriptors`).
        solve_tma: the split solve's q / k tiles through tensor descriptors.
        halves: ``(I + A)^{-1}`` from its diagonal halves (:func:`_inverse_unit_lower_halves`, from N = 32)
            instead of doubling the whole ``[N, N]`` tile.
        row_halves: the split solve as two programs per (request, value head), one per half of the rows
            (:func:`_gdn_tree_solve_rows_kernel`, from N = 32; ``solve_heads`` 1), instead of one over all rows.
        solve_max_registers: a register cap for the split solve (0: the compiler's choice).
    """

    block_v: int
    block_k: int
    num_warps: int
    num_stages: int = 2
    split: bool = True
    solve_warps: int = 8
    word_vectors: bool = False
    solve_heads: int = 1
    solve_stages: int = 0
    dot16: bool = True
    pdl: bool = False
    apply_pdl: bool = False
    scratch16: bool = False
    max_registers: int = 0
    early_signal: bool = True
    rank_one: bool = False
    tma: bool = False
    solve_tma: bool = False
    halves: bool = False
    row_halves: bool = False
    solve_max_registers: int = 0


# ----------------------------------------------------------------------------------------------------------- kernels
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
# [0, 2] and decays <= 1 (bench/NOTES-gdn.md, "A bound for a lead"); these powers of two keep them 16x below fp16's
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
def _gate_values(loaded, n_b, NP: tl.constexpr, GATED: tl.constexpr, BETA_TWO: tl.constexpr):
    """``g, beta [NP]`` from :func:`_load_gates`'s values."""
    real = tl.arange(0, NP) < n_b  # [NP]
    if GATED:
        x = loaded[0].to(tl.float32) + loaded[3].to(tl.float32)
        softplus = tl.where(x > 20.0, x, tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x))))
        g = tl.where(real, -tl.exp(loaded[2].to(tl.float32)) * softplus, 0.0)
        beta = tl.sigmoid(loaded[1].to(tl.float32))
        if BETA_TWO:
            beta = 2.0 * beta
        beta = tl.where(real, beta, 0.0)
    else:
        g = loaded[0].to(tl.float32)
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
    and the fused kernel, which holds more tiles at that point (255 registers and spills), 1.7 us slower
    (bench/NOTES-gdn.md, fourteenth session). In ``ieee`` mode (products on the CUDA cores) the split solve squares
    first too: there the overlapped form compiled to 32 registers and ~8 KB of stack (Triton 3.6 and 3.9, sm_90),
    and B = 64 took 5141.5 against 1243.3 us (twentieth session, runs 28-29)."""
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
            # warps (at 8 warps that over-covers a 64-row tile: bench/results/2026-12-03d, run 61)
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
    us over the nineteenth session's two steps). ``HALVES``: the inverse from its diagonal halves
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
        # kernel read shared memory out of range on the H200 (compute-sanitizer, twenty-sixth session, run 61)
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
def _real_rows(x, real, HAS_NUM: tl.constexpr):
    """A tile loaded through a descriptor with its padding nodes' rows set to zero (their memory may hold anything;
    rows past N come back zero-filled). Without sizes every row up to N is real."""
    if HAS_NUM:
        x = tl.where(real[:, None], x, 0.0)
    return x


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
    launched as a programmatic dependent launch (:mod:`~lumotree.optimized.pdl`): the program prefetches its
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


@triton.jit
def add_path_terms(s, on_path, rank, path_len, lg_a, delta_ptr, log_gamma_ptr, k_ptr, k_rnorm_ptr, b64, N, s_kb,
                   s_kn, s_kh, h, hv, vcols, kcols, H: tl.constexpr, HV: tl.constexpr, V: tl.constexpr,
                   NP: tl.constexpr, PB: tl.constexpr, L2NORM: tl.constexpr, PRECISION: tl.constexpr,
                   WEIGHT_KEYS: tl.constexpr = False):
    """``s + sum_{j in path} (Gamma_a / Gamma_j) k^_j[kcols] delta_j[vcols]^T`` (``s [BK, BV]``, the path of
    :func:`accepted_path`, ``lg_a = log Gamma_a``): PB nodes at a time, gathered into dense tiles, one ``tl.dot``
    each (operands rounded to tf32 in ``"tf32"``). The weights scale the delta rows, or the key rows with
    ``WEIGHT_KEYS``: the same sum, but not the same register allocation (ptxas, sm_90): the commit kernel at
    B = 1 takes 96 registers with the weights on the delta rows and 148 on the keys; the record's 2-warp
    ``[K, 32]`` form takes 233 registers on the keys and, on the delta rows, 32 registers and 3.4 KB of spills
    (its share of the B = 64 step 18 -> 53 us, run 102)."""
    lanes = tl.arange(0, PB)  # [PB]
    for p0 in range(0, path_len, PB):
        idx = path_chunk(on_path, rank, p0, NP, PB)  # [PB] node index of path entry p0 + lane
        live = p0 + lanes < path_len  # [PB]
        lg = tl.load(log_gamma_ptr + (b64 * N + idx) * HV + hv, mask=live, other=0.0)  # [PB]
        weight = tl.where(live, tl.exp(lg_a - lg), 0.0)  # [PB] Gamma_a / Gamma_j
        if L2NORM:
            weight = weight * tl.load(k_rnorm_ptr + (b64 * N + idx) * H + h, mask=live, other=0.0)
        d = tl.load(delta_ptr + ((b64 * N + idx[:, None]) * HV + hv) * V + vcols[None, :],
                    mask=live[:, None], other=0.0).to(tl.float32)  # [PB, BV]
        k_p = tl.load(k_ptr + b64 * s_kb + idx[:, None] * s_kn + h * s_kh + kcols[None, :],
                      mask=live[:, None], other=0.0).to(tl.float32)  # [PB, BK]
        if WEIGHT_KEYS:
            k_p = weight[:, None] * k_p
        else:
            d = weight[:, None] * d
        s = tl.dot(tl.trans(_tf32_round(k_p, PRECISION)), _tf32_round(d, PRECISION), s,
                   input_precision=PRECISION)  # [BK, BV]
    return s


@triton.jit
def _gdn_tree_commit_kernel(
    pool_ptr, slots_ptr, words_ptr, num_nodes_ptr, accepted_ptr,
    delta_ptr, log_gamma_ptr, k_ptr, k_rnorm_ptr,
    B, N, s_kb, s_kn, s_kh, s_pool_g, s_delta_g, s_lg_g, s_k_g, s_kr_g,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, W: tl.constexpr,
    NP: tl.constexpr, PB: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr,
    L2NORM: tl.constexpr, PRECISION: tl.constexpr, WORD_BITS: tl.constexpr, PDL: tl.constexpr,
    HAS_NUM: tl.constexpr, RANK_ONE: tl.constexpr, pool_desc, TMA: tl.constexpr,
):
    """One program per (layer, request, value head, V block, K block): ``S[rows, cols] = Gamma_a S0[rows, cols]
    + sum_{j in path(a)} (Gamma_a / Gamma_j) k_j[rows] delta_j[cols]^T``, in place (layer g's pool and factors at
    the ``s_*_g`` strides; the trees, slots and accepted nodes shared by the layers). ``PDL``: launched as a
    programmatic dependent launch (:mod:`~lumotree.optimized.pdl`): the program loads its ``S0`` tile and finds
    the accepted node's path (the slots, the pool, the sizes, the accepted nodes and the tree's ancestor words,
    none of which the previous kernel may write), then waits for the previous kernel before it reads the
    factors. ``RANK_ONE``: the path's terms added one node at a time as fp32 outer products on the CUDA cores, in
    the tile's own register layout (PB nodes' loads in flight at once), instead of a ``tl.dot`` of PB gathered nodes
    (whose operands and accumulator go through shared memory). ``TMA``: the state tile is loaded and stored through
    ``pool_desc`` (a tensor descriptor of the pools as ``[G P HV K, V]`` rows, block ``[BK, BV]``) instead of
    per-thread pointers."""
    pid = tl.program_id(0)
    pid_v = tl.program_id(1)
    pid_k = tl.program_id(2)
    g = (pid // (B * HV)).to(tl.int64)
    b = (pid // HV) % B
    hv = pid % HV
    pool_ptr += g * s_pool_g
    delta_ptr += g * s_delta_g
    log_gamma_ptr += g * s_lg_g
    k_ptr += g * s_k_g
    k_rnorm_ptr += g * s_kr_g
    h = hv // (HV // H)
    b64 = b.to(tl.int64)
    slot = tl.load(slots_ptr + b).to(tl.int64)
    vcols = pid_v * BV + tl.arange(0, BV)  # [BV]
    kcols = pid_k * BK + tl.arange(0, BK)  # [BK] state rows of this program
    if TMA:  # the tile's first row in the descriptor's [G P HV K, V] rows
        row0 = (g * (s_pool_g // V) + (slot * HV + hv) * K + pid_k * BK).to(tl.int32)
        s = pool_desc.load([row0, pid_v * BV])  # [BK, BV] S0
    else:
        state_ptrs = pool_ptr + (slot * HV + hv) * (K * V) + kcols[:, None] * V + vcols[None, :]  # [BK, BV]
        s = tl.load(state_ptrs)  # [BK, BV] S0
    n_b = tree_size(num_nodes_ptr, b, N, HAS_NUM)
    node = tl.load(accepted_ptr + b)
    on_path, rank, path_len = accepted_path(words_ptr + (b64 * N + node) * W, n_b, NP, WORD_BITS)  # path(node)
    if PDL:  # the step's inputs are read above, what the previous kernel may write (the factors) below
        tl.extra.cuda.gdc_wait()
    lg_a = tl.load(log_gamma_ptr + (b64 * N + node) * HV + hv)
    s = s * tl.exp(lg_a)  # [BK, BV] Gamma_a S0
    if RANK_ONE:  # the path's terms one node at a time, the loads of PB nodes in flight together
        nodes = tl.arange(0, NP)  # [NP]
        for p0 in range(0, path_len, PB):
            for j in tl.static_range(PB):
                node_j = tl.sum(tl.where(on_path & (rank == p0 + j), nodes, 0))  # path entry p0 + j (0 past the end)
                lg = tl.load(log_gamma_ptr + (b64 * N + node_j) * HV + hv)
                weight = tl.where(p0 + j < path_len, tl.exp(lg_a - lg), 0.0)  # Gamma_a / Gamma_j
                if L2NORM:
                    weight = weight * tl.load(k_rnorm_ptr + (b64 * N + node_j) * H + h)
                d = tl.load(delta_ptr + ((b64 * N + node_j) * HV + hv) * V + vcols).to(tl.float32)  # [BV]
                k_j = tl.load(k_ptr + b64 * s_kb + node_j * s_kn + h * s_kh + kcols).to(tl.float32)  # [BK]
                s += k_j[:, None] * (weight * d)[None, :]  # [BK, BV]
    else:
        s = add_path_terms(s, on_path, rank, path_len, lg_a, delta_ptr, log_gamma_ptr, k_ptr, k_rnorm_ptr, b64, N,
                           s_kb, s_kn, s_kh, h, hv, vcols, kcols, H, HV, V, NP, PB, L2NORM, PRECISION)
    if TMA:
        pool_desc.store([row0, pid_v * BV], s)
    else:
        tl.store(state_ptrs, s)


# ---------------------------------------------------------------------------------------------------------- configs
_NUM_SMS: dict[int, int] = {}


def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _NUM_SMS:
        _NUM_SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _NUM_SMS[idx]


def _padded_nodes(N: int) -> int:
    return max(16, triton.next_power_of_2(N))


def _solve_flags(cfg: KernelConfig, NP: int) -> dict:
    """The split solve's ``GATES_FIRST`` (one head, up to N = 64) and ``HALVES`` for config ``cfg`` at ``NP``
    padded nodes."""
    return dict(GATES_FIRST=cfg.solve_heads == 1 and NP <= 64, HALVES=_halves(cfg, NP))


def _fused_flags(cfg: KernelConfig, NP: int) -> dict:
    """The fused kernel's ``GATES_FIRST`` (up to N = 64) and ``HALVES``."""
    return dict(GATES_FIRST=NP <= 64, HALVES=_halves(cfg, NP))


def _halves(cfg: KernelConfig, NP: int) -> bool:
    """``HALVES``: ``cfg.halves`` from N = 32 (halves of at least 16 rows, the tensor cores' smallest tile)."""
    return bool(cfg.halves) and NP >= 32


def _row_halves(cfg: KernelConfig, NP: int) -> bool:
    """The split solve by row halves (:func:`_gdn_tree_solve_rows_kernel`): ``cfg.row_halves`` from N = 32, as
    :func:`_halves`."""
    return bool(cfg.row_halves) and NP >= 32


def verify_config(B: int, HV: int, N: int, K: int, V: int, device: torch.device,
                  H: int | None = None, precision: str = "tf32", dtype: torch.dtype = torch.float32) -> KernelConfig:
    """Default launch parameters of verify at Qwen3-Next-like shapes on an H200 (each rule the winner of a same-run
    A / B: docs/gdn-kernels-log.md, "Where the defaults come from").

    - ``ieee`` past N = 64, every batch: the split pipeline, 16-column apply at 8 warps, an 8-warp 2-stage solve
      by row halves (``row_halves``).
    - Large batches (``B * HV >= 2x`` the SMs): the split pipeline. The solve takes the two value heads of a GVA
      group (``H`` given, ``HV // H`` even) in one 4-warp program up to N = 64, 3 stages (past N = 64 by row halves
      at 4 warps, 2 stages; ``ieee`` below); the apply 64 columns up to N = 32, 32 at
      N = 64, 128 at 8 warps past it. In ``tf32`` at N = 64 the scratch is fp16 and the apply runs 3 stages capped
      at 128 registers; from ``B * HV >= 8x`` the SMs it takes 64 columns uncapped and signals its PDL successor
      only as it exits (``early_signal=False``).
    - Small batches at N = 64 in the tensor-core modes: the split pipeline, one value head per 4-warp solve, a
      3-stage 32-column apply, fp16 scratch; past N = 64 an 8-warp 2-stage solve by row halves and a 64-column
      8-warp apply.
    - Small batches otherwise (N <= 32, ``ieee`` at N = 64): the fused kernel, 32 columns, 4 warps, 3 stages; when
      its programs fit in one wave at N = 32, 16-row K chunks and 4 stages.
    - Every split pipeline: the apply a PDL launch behind the solve; the solve's q / k through tensor descriptors
      (not in the solve by row halves); the apply's tiles too from N = 64 (not ``ieee`` at N = 128); the
      solve by halves past N = 64. The fused kernel's tiles through descriptors in the tensor-core modes with fp32
      inputs (``dtype``: q / k / v's), except at the one-wave N = 32 shape.
    """
    NP = _padded_nodes(N)
    if NP > 64 and precision == "ieee":  # every batch: the apply at 16 columns (79 registers, no stack; 128 columns
        # compile to 32 registers and 16 KB of stack), the split pipeline at small batches too (twentieth session,
        # run 30, verify + commit: B = 64 23252.6 -> 19596.2 us; B = 1 against the fused kernel 4286.4 -> 620.9),
        # the solve by row halves at 8 warps (twenty-fifth session, run 60: B = 64 4978.8 -> 4831.4, B = 1 181.8 ->
        # 152.4 against one 16-warp program per value head)
        return KernelConfig(min(16, V), min(K, 32), 8, 2, True, 8, apply_pdl=True, halves=True, row_halves=True)
    if B * HV >= 2 * _num_sms(device):
        block_v, num_warps = (64, 4) if NP <= 32 else (32, 4) if NP <= 64 else (128, 8)
        pair = 2 if NP <= 64 and H is not None and (HV // H) % 2 == 0 else 1
        # tf32 at N = 64: fp16 scratch (where the norms are in the kernel), the apply at 3 stages capped at 128
        # registers (4 programs per SM; compile-only, no spills with fp32 scratch either); tf32x3's apply would
        # spill at the cap (150 registers uncapped)
        fp16_scratch = NP == 64 and precision == "tf32"
        # from ~8 programs' worth of (request, value head) pairs per SM: 64-column apply blocks (q / k read half as
        # often; 166 registers, 3 programs per SM) and the commit launched only as the apply exits
        wide = fp16_scratch and B * HV >= 8 * _num_sms(device)
        # past N = 64 (the tensor-core modes; ieee above): the solve by row halves, 4 warps, 2 stages (against one
        # 8-warp program per value head: tf32 B = 64 1021.0 -> 980.5 us, twenty-fifth session, run 60; tf32x3
        # B = 64 / 16 2467.3 / 635.0 -> 1699.2 / 465.6, twenty-sixth session, run 64)
        rows = NP > 64
        return KernelConfig(min(64 if wide else block_v, V), min(K, 32), num_warps, 3 if fp16_scratch else 2, True,
                            4, solve_heads=pair, solve_stages=2 if rows else 3, apply_pdl=True, scratch16=fp16_scratch,
                            max_registers=128 if fp16_scratch and not wide else 0,
                            early_signal=not wide, tma=NP >= 64, solve_tma=not rows, halves=NP > 64, row_halves=rows)
    if NP == 64 and precision != "ieee":  # small batches: one value head per solve program, fp16 scratch
        return KernelConfig(min(32, V), min(K, 32), 4, 3, True, 4, solve_heads=1, solve_stages=3, apply_pdl=True,
                            scratch16=True, solve_tma=True)
    if NP > 64:  # small batches in the tensor-core modes: the split pipeline, an 8-warp solve by row halves, a
        # 64-column apply through descriptors (twenty-fifth session, run 60, against the fused kernel: tf32 B = 1
        # 65.8 -> 43.7 us, B = 8 259.4 -> 179.8; tf32x3 B = 1 152.0 -> 85.1)
        return KernelConfig(min(64, V), min(K, 32), 8, 2, True, 8, solve_stages=2, apply_pdl=True, tma=True,
                            halves=True, row_halves=True)
    block_v, block_k, num_warps, stages = 32, 32, 4, 3
    one_wave = NP == 32 and B * HV * triton.cdiv(V, block_v) <= _num_sms(device)  # B = 1 at Qwen3-Next shapes
    if one_wave:  # the model-like sweep (cold states, the model's strided views; bench/NOTES-gdn.md, sixth
        # session): 10.8 against 12.2 us (fp32, state in L2: 15.2 against 17.3)
        block_k, stages = 16, 4
    return KernelConfig(min(block_v, V), min(K, block_k), num_warps, stages, False,
                        tma=precision != "ieee" and not one_wave and dtype == torch.float32)


def commit_config(B: int, HV: int, N: int, K: int, V: int, device: torch.device,
                  precision: str = "tf32") -> KernelConfig:
    """Default launch parameters of the commit kernel (memory-bound: a ``[K, BV]`` state tile per program). Large
    batches (``B`` counts (layer, request) pairs when several layers commit in one launch): 64 columns, 4 warps,
    capped at 128 registers in ``tf32`` (4 programs per SM instead of 3), the path's terms as rank-one fp32 updates
    in ``ieee``; small batches ``[32, 32]`` tiles at 2 warps. Measurements: docs/gdn-kernels-log.md, "Where the
    defaults come from"."""
    if B * HV * 2 >= 2 * _num_sms(device):
        return KernelConfig(min(V, 64), K, 4, 1, max_registers=128 if precision == "tf32" else 0,
                            rank_one=precision == "ieee")
    return KernelConfig(min(V, 32), min(K, 32), 2, 1)


# ---------------------------------------------------------------------------------------------------------- wrappers
def _pow2_dim(name: str, value: int) -> None:
    if value < 16 or value > 256 or value & (value - 1):
        raise ValueError(f"{name} = {value}: the kernels need a power of two in [16, 256]")


def _check_config(cfg: object) -> None:
    if not isinstance(cfg, KernelConfig):
        raise TypeError(f"config must be a KernelConfig, got {type(cfg).__name__}")
    for name in ("max_registers", "solve_max_registers"):
        cap = getattr(cfg, name)
        if cap and not 16 <= cap <= 255:
            raise ValueError(f"config.{name} = {cap}: 0 (the compiler's choice) or 16 to 255")


def _check_precision(input_precision: object) -> str:
    if input_precision not in PRECISIONS:
        raise ValueError(f"input_precision = {input_precision!r}, expected one of {PRECISIONS}")
    return str(input_precision)


def tree_meta(parents: torch.Tensor, num_nodes: torch.Tensor | None = None, *, validate: bool = True) -> TreeMeta:
    """Per-step tree metadata shared by every layer: ancestor ``words [B, N, ceil(N/32)]`` and ``depth [B, N]``.

    ``parents: [B, N]`` int, each request's first ``num_nodes[b]`` entries a tree in topological order (padding
    entries are ignored: they are replaced by a chain below the last real node before the bitsets are built).
    """
    device = parents.device if isinstance(parents, torch.Tensor) else torch.device("cpu")
    check_tensor("parents", parents, (None, None), "B, N", (torch.int32, torch.int64), device)
    B, N = parents.shape
    if N < 1 or N > MAX_NODES:
        raise ValueError(f"parents has N = {N} nodes per request; the kernels support 1 <= N <= {MAX_NODES}")
    if num_nodes is not None:
        num_nodes = check_num_nodes(num_nodes, B, N, device, validate)
    if validate:
        check_tree_rows(parents, check_num_nodes(num_nodes, B, N, device, False))
    return tree_metadata(parents, num_nodes=num_nodes, validate=False)  # padding nodes read as a chain


def _check_meta(meta: object, B: int, N: int, device: torch.device) -> TreeMeta:
    if not isinstance(meta, TreeMeta):
        raise TypeError(f"meta must be a TreeMeta (from tree_meta()), got {type(meta).__name__}")
    W = (N + WORD_BITS - 1) // WORD_BITS
    check_tensor("meta.words", meta.words, (B, N, W), "B, N, ceil(N/32)", (torch.int32,), device, contiguous=True)
    check_tensor("meta.depth", meta.depth, (B, N), "B, N", (torch.int32,), device, contiguous=True)
    return meta


def _check_gate(gate: object, B: int, N: int, HV: int, V: int, device: torch.device) -> None:
    if not isinstance(gate, OutputGate):
        raise TypeError(f"gate must be an OutputGate or None, got {type(gate).__name__}")
    check_tensor("gate.z", gate.z, (B, N, HV, V), "B, N, HV, V", FLOAT_DTYPES, device)
    check_tensor("gate.weight", gate.weight, (V,), "V", FLOAT_DTYPES, device, contiguous=True)
    check_tensor("gate.parts", gate.parts, (B, N, HV, V // GATE_PIECE), f"B, N, HV, V / {GATE_PIECE}",
                 (torch.float32,), device, contiguous=True)


def _tma_descriptors(tensors: dict, blocks: dict, enabled: bool = True) -> dict:
    """Host-built tensor descriptors (``name_desc``: zero padding past the edges) of ``tensors[name]`` with block
    ``blocks[name]``, or all None when not ``enabled`` (the config asks for pointers) or when one of them cannot be
    addressed so (:func:`~lumotree.optimized._checks.tma_possible`)."""
    if not enabled or not tma_possible(*tensors.values()):
        return {f"{name}_desc": None for name in tensors}
    from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: PLC0415 - only where TMA is used

    return {f"{name}_desc": TensorDescriptor(t, list(t.shape), list(t.stride()), list(blocks[name]))
            for name, t in tensors.items()}


def _verify_descriptors(enabled: bool, state_pool, q, k, v, o, delta, NP: int, block_k: int, block_v: int,
                        **scratch) -> dict:
    """The verify kernels' descriptors (:func:`_tma_descriptors`): the pool's ``[BK, BV]`` state tiles (the pool as
    ``[P HV K, V]`` rows), q / k / v / o / delta ``[1, NP, 1, B*]`` node tiles of their ``[B, N, H*, *]`` tensors and
    the split pipeline's ``[NP, NP]`` scratch tiles (``scratch``: name -> ``[B HV, NP, NP]`` tensor)."""
    V = state_pool.shape[-1]
    tile = [1, NP, 1]
    tensors = dict(pool=state_pool.view(-1, V), q=q, k=k, v=v, o=o, delta=delta,
                   **{name: t.view(-1, NP) for name, t in scratch.items()})
    blocks = dict(pool=[block_k, block_v], q=[*tile, block_k], k=[*tile, block_k], v=[*tile, block_v],
                  o=[*tile, block_v], delta=[*tile, block_v], **{name: [NP, NP] for name in scratch})
    return _tma_descriptors(tensors, blocks, enabled)


def _verify(q, k, v, gate_a, gate_b, A_log, dt_bias, state_pool, slots, parents, *, gated, allow_neg_eigval,
            use_qk_l2norm_in_kernel, scale, num_nodes, meta, input_precision, validate, out, config, pdl, gate,
            launch_dependents):
    names = ("a", "b") if gated else ("g", "beta")
    device = q.device if isinstance(q, torch.Tensor) else torch.device("cpu")
    check_tensor("q", q, (None, None, None, None), "B, N, H, K", FLOAT_DTYPES, device)
    B, N, H, K = q.shape
    check_tensor("k", k, (B, N, H, K), "B, N, H, K", (q.dtype,), device)
    check_tensor("v", v, (B, N, None, None), "B, N, HV, V", (q.dtype,), device)
    HV, V = v.shape[2], v.shape[3]
    if HV % H != 0:
        raise ValueError(f"v has HV = {HV} value heads, not a multiple of H = {H} q/k heads (GVA)")
    _pow2_dim("K (q.shape[3])", K)
    _pow2_dim("V (v.shape[3])", V)
    gate_dtypes = (torch.float32, q.dtype)
    check_tensor(names[0], gate_a, (B, N, HV), "B, N, HV", gate_dtypes, device, last_contiguous=False)
    check_tensor(names[1], gate_b, (B, N, HV), "B, N, HV", gate_dtypes, device, last_contiguous=False)
    if gated:
        check_tensor("A_log", A_log, (HV,), "HV", (torch.float32, q.dtype), device, contiguous=True)
        check_tensor("dt_bias", dt_bias, (HV,), "HV", (torch.float32, q.dtype), device, contiguous=True)
    check_tensor("state_pool", state_pool, (None, HV, K, V), "P, HV, K, V", (torch.float32,), device, contiguous=True)
    check_tensor("parents", parents, (B, N), "B, N", (torch.int32, torch.int64), device)
    if N > MAX_NODES:
        raise ValueError(f"parents has N = {N} nodes per request; the kernels support at most {MAX_NODES}")
    slots = check_slots(slots, B, state_pool.shape[0], device, validate, distinct=False)
    has_num = num_nodes is not None  # else every tree has N nodes: the kernels read no sizes
    num_nodes = check_sizes(num_nodes, B, N, device, validate)
    scale = K**-0.5 if scale is None else check_scalar("scale", scale)
    precision = _check_precision(input_precision)
    if meta is not None:
        meta = _check_meta(meta, B, N, device)
    if out is not None:
        if not isinstance(out, tuple) or len(out) != 4:
            raise TypeError("out must be a tuple (o, delta, log_gamma, k_rnorm)")
        check_tensor("out[0] (o)", out[0], (B, N, HV, V), "B, N, HV, V", (v.dtype,), device, contiguous=True)
        check_tensor("out[1] (delta)", out[1], (B, N, HV, V), "B, N, HV, V", (torch.float32,), device, contiguous=True)
        check_tensor("out[2] (log_gamma)", out[2], (B, N, HV), "B, N, HV", (torch.float32,), device, contiguous=True)
        if use_qk_l2norm_in_kernel:
            check_tensor("out[3] (k_rnorm)", out[3], (B, N, H), "B, N, H", (torch.float32,), device, contiguous=True)
    if gate is not None:
        _check_gate(gate, B, N, HV, V, device)
    if validate:
        check_tree_rows(parents, num_nodes)
        real = node_mask(num_nodes, N)  # [B, N]
        for name, t in (("q", q), ("k", k), ("v", v), (names[0], gate_a), (names[1], gate_b)):
            check_finite_nodes(name, t, real)
        if gated:
            check_finite_nodes("A_log", A_log[None, None], None)
            check_finite_nodes("dt_bias", dt_bias[None, None], None)
        else:
            check_range_nodes("g", gate_a, float("-inf"), 0.0, real)
            check_range_nodes("beta", gate_b, 0.0, 2.0, real)
        check_finite_nodes("state_pool[slots]", state_pool[slots.long()][None], None)
    if meta is None:
        meta = tree_meta(parents, num_nodes if has_num else None, validate=False)
    sizes = dict(HAS_NUM=has_num)
    num_nodes = num_nodes if has_num else slots  # an unused int pointer without sizes
    cfg = config or verify_config(B, HV, N, K, V, device, H, precision, q.dtype)
    _check_config(cfg)
    signal = bool(launch_dependents) and bool(cfg.early_signal) and pdl_supported(device)

    if out is None:
        o = torch.empty((B, N, HV, V), dtype=v.dtype, device=device)  # [B, N, HV, V]
        delta = torch.empty((B, N, HV, V), dtype=torch.float32, device=device)  # [B, N, HV, V]
        log_gamma = torch.empty((B, N, HV), dtype=torch.float32, device=device)  # [B, N, HV]
        k_rnorm = torch.empty((B, N, H), dtype=torch.float32, device=device) if use_qk_l2norm_in_kernel else None
    else:
        o, delta, log_gamma, k_rnorm = out
        k_rnorm = k_rnorm if use_qk_l2norm_in_kernel else None
    qk16 = q.dtype in (torch.bfloat16, torch.float16)  # tf32-exact q / k: no rounding, |k|^2 from K K^T
    if cfg.solve_heads < 1 or (HV // H) % cfg.solve_heads != 0:
        raise ValueError(f"config.solve_heads = {cfg.solve_heads} must divide HV // H = {HV // H} "
                         "(value heads per q/k head)")
    if cfg.row_halves and cfg.solve_heads != 1:
        raise ValueError(f"config.row_halves takes one value head per solve program, not solve_heads = "
                         f"{cfg.solve_heads}")
    NP = _padded_nodes(N)
    block_v = min(cfg.block_v, V)
    block_k = min(cfg.block_k, K)
    gate_strides = (gate_a.stride(0), gate_a.stride(1), gate_a.stride(2),
                    gate_b.stride(0), gate_b.stride(1), gate_b.stride(2))
    qk_strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2))
    k_rnorm_arg = k_rnorm if k_rnorm is not None else log_gamma  # an unused pointer when not normalising
    if gate is not None and block_v % GATE_PIECE:
        raise ValueError(f"config.block_v = {cfg.block_v} must be a multiple of {GATE_PIECE} for an output gate")
    gate_args = (gate.z, gate.weight, gate.parts) if gate is not None else (o, o, log_gamma)  # unused without a gate
    z_strides = (gate.z.stride(0), gate.z.stride(1), gate.z.stride(2)) if gate is not None else (0, 0, 0)
    gate_flags = dict(GATE=gate is not None, PIECE=GATE_PIECE)
    flags = dict(GATED=gated, BETA_TWO=bool(allow_neg_eigval), L2NORM=bool(use_qk_l2norm_in_kernel),
                 PRECISION=precision, WORD_VECTORS=bool(cfg.word_vectors), QK16=qk16)
    gram_flags = dict(DOT16=qk16 and precision != "ieee" and bool(cfg.dot16))
    if cfg.split:
        q_rnorm = torch.empty((B, NP, H), dtype=torch.float32, device=device)  # [B, NP, H]
        scratch16 = bool(cfg.scratch16) and precision == "tf32" and bool(use_qk_l2norm_in_kernel)  # bounded
        scratch = torch.float16 if scratch16 else torch.float32
        tb = torch.empty((B * HV, NP, NP), dtype=scratch, device=device)  # [B*HV, NP, NP] (I + A)^-1 diag(beta)
        qkd = torch.empty((B * HV, NP, NP), dtype=scratch, device=device)  # [B*HV, NP, NP] Q K^T ⊙ D
        solve_flags = _solve_flags(cfg, NP)
        apply_pdl = bool(cfg.apply_pdl) and pdl_supported(device)
        descs = _verify_descriptors(bool(cfg.tma or cfg.solve_tma), state_pool, q, k, v, o, delta, NP, block_k,
                                    block_v, tb=tb, qkd=qkd)
        solve_args = (q, k, gate_a, gate_b, A_log if gated else gate_a, dt_bias if gated else gate_a,
                      meta.words, meta.depth, num_nodes, log_gamma, k_rnorm_arg, q_rnorm, tb, qkd)
        solve_consts = dict(H=H, HV=HV, K=K, W=meta.words.shape[2], NP=NP, LOG_NP=NP.bit_length() - 1, BK=block_k,
                            WORD_BITS=WORD_BITS, num_warps=cfg.solve_warps,
                            num_stages=cfg.solve_stages or cfg.num_stages, PDL=apply_pdl, SCRATCH16=scratch16,
                            **flags, **gram_flags, **sizes,
                            **({"maxnreg": cfg.solve_max_registers} if cfg.solve_max_registers else {}))
        if _row_halves(cfg, NP):
            ready = torch.zeros((B * HV,), dtype=torch.int32, device=device)  # [B*HV] the upper halves' flags
            c_lower = torch.empty((B * HV, NP // 2, NP // 2), dtype=torch.float32, device=device)  # C per value head
            solve_consts.pop("WORD_VECTORS")
            _gdn_tree_solve_rows_kernel[(B * HV * 2,)](*solve_args, ready, c_lower, N, *qk_strides, *gate_strides,
                                                       **solve_consts)
        else:
            _gdn_tree_solve_kernel[(B * HV // cfg.solve_heads,)](
                *solve_args, N, *qk_strides, *gate_strides, HEADS=cfg.solve_heads, **solve_consts, **solve_flags,
                q_desc=descs["q_desc"] if cfg.solve_tma else None, k_desc=descs["k_desc"] if cfg.solve_tma else None,
                TMA=bool(cfg.solve_tma) and descs["q_desc"] is not None,
            )
        _gdn_tree_apply_kernel[(V // block_v, B * HV)](
            q, k, v, state_pool, slots, num_nodes, log_gamma, k_rnorm_arg, q_rnorm, tb, qkd, o, delta, *gate_args,
            scale, N, *qk_strides, v.stride(0), v.stride(1), v.stride(2), *z_strides,
            H=H, HV=HV, K=K, V=V, NP=NP, BK=block_k, BV=block_v, L2NORM=bool(use_qk_l2norm_in_kernel),
            PRECISION=precision, QK16=qk16, PDL=apply_pdl, SIGNAL=signal, SCRATCH16=scratch16,
            **(descs if cfg.tma else {n: None for n in descs}), TMA=bool(cfg.tma) and descs["pool_desc"] is not None,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **gate_flags, **sizes,
            **({"launch_pdl": True} if apply_pdl else {}),
            **({"maxnreg": cfg.max_registers} if cfg.max_registers else {}),
        )
    else:
        pdl = bool(pdl) and bool(cfg.pdl) and pdl_supported(device)
        descs = _verify_descriptors(bool(cfg.tma), state_pool, q, k, v, o, delta, NP, block_k, block_v)
        _gdn_tree_verify_kernel[(B * HV, V // block_v)](
            q, k, v, gate_a, gate_b, A_log if gated else gate_a, dt_bias if gated else gate_a,
            state_pool, slots, meta.words, meta.depth, num_nodes,
            o, delta, log_gamma, k_rnorm_arg, *gate_args, scale, N,
            *qk_strides, v.stride(0), v.stride(1), v.stride(2), *gate_strides, *z_strides,
            H=H, HV=HV, K=K, V=V, W=meta.words.shape[2], NP=NP, LOG_NP=NP.bit_length() - 1, BK=block_k,
            BV=block_v, WORD_BITS=WORD_BITS, PDL=pdl, STATE_LINES=max(1, block_v * 4 // 128), SIGNAL=signal,
            **_fused_flags(cfg, NP), **descs, TMA=descs["pool_desc"] is not None,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **flags, **gram_flags, **gate_flags, **sizes,
            **({"launch_pdl": True} if pdl else {}),
        )
    return o, TreeFactors(delta, log_gamma, k, k_rnorm)


def gdn_tree_verify(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state_pool: torch.Tensor,
    slots: torch.Tensor,
    parents: torch.Tensor,
    *,
    scale: float | None = None,
    num_nodes: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    input_precision: str = "ieee",
    meta: TreeMeta | None = None,
    validate: bool = True,
    out: tuple | None = None,
    config: KernelConfig | None = None,
    pdl: bool = False,
    gate: OutputGate | None = None,
    launch_dependents: bool = False,
) -> tuple[torch.Tensor, TreeFactors]:
    """Verify a batch of draft trees on one GDN layer from precomputed gates; returns ``(o, factors)``.

    ``q, k: [B, N, H, K]``, ``v: [B, N, HV, V]`` (fp32, bf16 or fp16, last dim contiguous), ``g`` (log decay, <= 0)
    and ``beta`` (after its activation, in [0, 2]): ``[B, N, HV]``; ``state_pool: [P, HV, K, V]`` fp32, read at
    ``slots: [B]`` (not modified); ``parents: [B, N]`` with ``parents[b, 0] == -1``; ``num_nodes: [B]`` for trees
    smaller than N (padding ignored, written as zeros). ``o: [B, N, HV, V]`` in v's dtype,
    ``o_i = scale * S_i^T q_i`` with ``S_i`` the state after node i. ``use_qk_l2norm_in_kernel`` L2-normalises q and
    k (``x * rsqrt(|x|^2 + 1e-6)``). ``input_precision``: ``"ieee"`` (fp32 FMA), ``"tf32x3"`` or ``"tf32"`` (tensor
    cores). ``meta``: this step's :func:`tree_meta` (built here when None). ``validate=False`` skips the checks that
    read data back to the host (tree structure, slot range, finiteness, gate ranges), e.g. inside CUDA-graph capture.
    ``out``: preallocated ``(o, delta, log_gamma, k_rnorm)``. ``config``: launch parameters (default
    :func:`verify_config`). ``pdl``: allow the fused kernel a programmatic dependent launch where the device
    supports it and the config asks for one (``KernelConfig.pdl``; :mod:`~lumotree.optimized.pdl`): it prefetches
    its ``S0`` tiles into L2 before it waits for the previous kernel. The split pipeline ignores it (its apply
    kernel's PDL launch behind its own solve is ``KernelConfig.apply_pdl``). ``gate`` (an :class:`OutputGate`):
    ``o`` holds the gated output before its norm factor, the factor's pieces go to ``gate.parts``.
    ``launch_dependents``: every program of the last verify kernel signals at its start that a PDL-launched
    successor may launch (:mod:`~lumotree.optimized.pdl`), e.g. ``gdn_tree_commit(pdl=True)`` right behind it.
    """
    return _verify(q, k, v, g, beta, None, None, state_pool, slots, parents, gated=False, allow_neg_eigval=False,
                   use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, scale=scale, num_nodes=num_nodes, meta=meta,
                   input_precision=input_precision, validate=validate, out=out, config=config, pdl=pdl, gate=gate,
                   launch_dependents=launch_dependents)


def gdn_tree_verify_gated(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state_pool: torch.Tensor,
    slots: torch.Tensor,
    parents: torch.Tensor,
    *,
    allow_neg_eigval: bool = False,
    use_qk_l2norm_in_kernel: bool = True,
    scale: float | None = None,
    num_nodes: torch.Tensor | None = None,
    input_precision: str = "ieee",
    meta: TreeMeta | None = None,
    validate: bool = True,
    out: tuple | None = None,
    config: KernelConfig | None = None,
    pdl: bool = False,
    gate: OutputGate | None = None,
    launch_dependents: bool = False,
) -> tuple[torch.Tensor, TreeFactors]:
    """:func:`gdn_tree_verify` with the gates fused: raw projections ``a, b: [B, N, HV]``, ``A_log, dt_bias: [HV]``.

    ``g = -exp(A_log) * softplus(a + dt_bias)``, ``beta = sigmoid(b)`` (``2 * sigmoid(b)`` with
    ``allow_neg_eigval``); q and k are L2-normalised in the kernel unless ``use_qk_l2norm_in_kernel=False``.
    """
    return _verify(q, k, v, a, b, A_log, dt_bias, state_pool, slots, parents, gated=True,
                   allow_neg_eigval=allow_neg_eigval, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, scale=scale,
                   num_nodes=num_nodes, meta=meta, input_precision=input_precision, validate=validate, out=out,
                   config=config, pdl=pdl, gate=gate, launch_dependents=launch_dependents)


def check_factors(factors: object, lead: tuple[int, ...], HV: int, K: int, V: int,
                  device: torch.device) -> tuple:
    """A verify's :class:`TreeFactors` for a pool of ``HV`` value heads of ``[K, V]`` states (``lead``: leading
    layer dimensions): ``(delta, log_gamma, k, k_rnorm, B, N, H)``."""
    if not isinstance(factors, TreeFactors):
        raise TypeError(f"factors must be the TreeFactors returned by gdn_tree_verify, got {type(factors).__name__}")
    delta, log_gamma, k, k_rnorm = factors
    named = "G, " * len(lead)
    check_tensor("factors.delta", delta, (*lead, None, None, HV, V), named + "B, N, HV, V",
                 (torch.float32, torch.float16), device)
    B, N = delta.shape[-4:-2]
    check_tensor("factors.log_gamma", log_gamma, (*lead, B, N, HV), named + "B, N, HV", (torch.float32,), device)
    check_tensor("factors.k", k, (*lead, B, N, None, K), named + "B, N, H, K", FLOAT_DTYPES, device)
    H = k.shape[-2]
    if HV % H != 0:
        raise ValueError(f"state_pool has HV = {HV} value heads, not a multiple of H = {H} (factors.k)")
    if k_rnorm is not None:
        check_tensor("factors.k_rnorm", k_rnorm, (*lead, B, N, H), named + "B, N, H", (torch.float32,), device)
    return delta, log_gamma, k, k_rnorm, B, N, H


def check_commit_tree(parents: object, slots: object, num_nodes: object, accepted: object, meta: object, B: int,
                      N: int, P: int, device: torch.device, validate: bool) -> tuple:
    """A commit's trees (``parents [B, N]``), distinct ``slots`` into a pool of ``P``, sizes, accepted nodes (None:
    none to check, as for a verify that writes the pool) and metadata (built when None): ``(slots, num_nodes,
    accepted, meta, has_num)``; ``has_num``: sizes were given (else every tree has N nodes and the kernels read no
    sizes)."""
    check_tensor("parents", parents, (B, N), "B, N", (torch.int32, torch.int64), device)
    if N > MAX_NODES:
        raise ValueError(f"parents has N = {N} nodes per request; the kernels support at most {MAX_NODES}")
    slots = check_slots(slots, B, P, device, validate, distinct=True)
    has_num = num_nodes is not None
    num_nodes = check_sizes(num_nodes, B, N, device, validate)
    if accepted is not None:
        accepted = check_node_index("accepted", accepted, B, num_nodes, device, validate)
    if meta is not None:
        meta = _check_meta(meta, B, N, device)
    if validate:
        check_tree_rows(parents, num_nodes)
    if meta is None:
        meta = tree_meta(parents, num_nodes if has_num else None, validate=False)
    return slots, num_nodes, accepted, meta, has_num


def gdn_tree_commit(
    state_pool: torch.Tensor,
    slots: torch.Tensor,
    factors: TreeFactors,
    parents: torch.Tensor,
    accepted: torch.Tensor,
    *,
    num_nodes: torch.Tensor | None = None,
    input_precision: str = "ieee",
    meta: TreeMeta | None = None,
    validate: bool = True,
    config: KernelConfig | None = None,
    pdl: bool = False,
) -> torch.Tensor:
    """Rebuild each request's accepted node's state from ``S0`` and the factors on its path, in place in the pool.

    ``state_pool[slots[b]] = Gamma_a S0 + sum_{j in path(a)} (Gamma_a / Gamma_j) k_j delta_j^T`` with
    ``a = accepted[b]`` (any node, the root included), all requests in one launch. ``factors`` from
    :func:`gdn_tree_verify` of the same trees (``num_nodes`` and ``meta`` as there). Slots must be distinct.

    Layers verified on the same trees commit in one launch: ``state_pool: [G, P, HV, K, V]`` and factors with the
    same leading layer dimension (``delta: [G, B, N, HV, V]``, ``log_gamma: [G, B, N, HV]``, ``k: [G, B, N, H, K]``,
    ``k_rnorm: [G, B, N, H]``; each layer's block laid out as for one layer, the layers at any stride): layer g's
    factors go into layer g's pool. ``pdl``: a programmatic dependent launch where the device supports it
    (:mod:`~lumotree.optimized.pdl`): each program loads its ``S0`` tile and finds the accepted node's path before
    it waits for the previous kernel, which must write none of ``slots``, ``state_pool``, ``accepted``,
    ``num_nodes`` and the tree's metadata (the verify of the same step qualifies; with
    ``gdn_tree_verify(launch_dependents=True)`` the commit launches under the verify's tail). Returns
    ``state_pool``.
    """
    device = state_pool.device if isinstance(state_pool, torch.Tensor) else torch.device("cpu")
    layered = isinstance(state_pool, torch.Tensor) and state_pool.ndim == 5
    check_tensor("state_pool", state_pool, (None,) * (5 if layered else 4),
                 "G, P, HV, K, V" if layered else "P, HV, K, V", (torch.float32,), device, contiguous=True)
    P, HV, K, V = state_pool.shape[-4:]
    delta, log_gamma, k, k_rnorm, B, N, H = check_factors(factors, state_pool.shape[:-4], HV, K, V, device)
    if not layered:  # one layer: a stack of one
        state_pool, delta, log_gamma, k = state_pool[None], delta[None], log_gamma[None], k[None]
        k_rnorm = k_rnorm[None] if k_rnorm is not None else None
    for name, t in (("factors.delta", delta), ("factors.log_gamma", log_gamma), ("factors.k_rnorm", k_rnorm)):
        if t is not None and not t[0].is_contiguous():
            raise ValueError(f"{name} must be contiguous within each layer (strides {tuple(t.stride())})")
    _pow2_dim("K", K)
    _pow2_dim("V", V)
    slots, num_nodes, accepted, meta, has_num = check_commit_tree(parents, slots, num_nodes, accepted, meta, B, N, P,
                                                                  device, validate)
    precision = _check_precision(input_precision)
    cfg = config or commit_config(state_pool.shape[0] * B, HV, N, K, V, device, precision)  # the layers' programs
    pdl = bool(pdl) and pdl_supported(device)
    _check_config(cfg)
    block_v = min(cfg.block_v, V)
    block_k = min(cfg.block_k, K)
    kr = k_rnorm if k_rnorm is not None else log_gamma  # an unused pointer when k was not normalised
    pool_desc = _tma_descriptors(dict(pool=state_pool.view(-1, V)), dict(pool=[block_k, block_v]),
                                 bool(cfg.tma))["pool_desc"]
    _gdn_tree_commit_kernel[(state_pool.shape[0] * B * HV, V // block_v, K // block_k)](
        state_pool, slots, meta.words, num_nodes if has_num else slots, accepted, delta, log_gamma, k, kr,
        B, N, k.stride(1), k.stride(2), k.stride(3),
        state_pool.stride(0), delta.stride(0), log_gamma.stride(0), k.stride(0), kr.stride(0),
        H=H, HV=HV, K=K, V=V, W=meta.words.shape[2], NP=_padded_nodes(N),
        PB=RANK_ONE_BLOCK if cfg.rank_one else PATH_BLOCK, BV=block_v,
        BK=block_k, L2NORM=k_rnorm is not None, PRECISION=precision, WORD_BITS=WORD_BITS, PDL=pdl, HAS_NUM=has_num,
        RANK_ONE=cfg.rank_one, pool_desc=pool_desc, TMA=pool_desc is not None,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **({"launch_pdl": True} if pdl else {}),
        **({"maxnreg": cfg.max_registers} if cfg.max_registers else {}),
    )
    return state_pool if layered else state_pool[0]
