r"""Gluon kernels of the fused GDN tree verify (Hopper): one persistent warp-specialised kernel per step.

Items are (request, value head), one program per SM walking them. Partitions, each in a loop over the program's
items (the docs' page on deferred commits gives the measured step):

- loader (1 warp): TMA loads of each item's ``S`` / q / k chunks (``[BK, V]``, ``[N, BK]``) into a ring of
  ``STAGES`` slots, the slot's pending path tiles (``kpt [K, PATH]``, ``dp [PATH, V]``) and ``v [N, V]``;
- consumer (8 warps, the default partition): every state chunk becomes ``gamma_a S + kpt dp`` (the pending
  commit, :mod:`~lumotree.optimized.ops.gdn_tree.pending`), is written back by TMA and used: ``(K S0)^T``,
  ``(Q S0)^T`` accumulate chunk by chunk (transposed: ``wgmma`` takes tf32 shared operands K-major only); then
  ``Delta^T = X^T TB^T`` and ``O^T = (Q S0)^T diag(scale Gamma) + Delta^T QKD^T`` with ``X = V - diag(Gamma) K S0``,
  in fp16 x fp16 products with fp32 accumulation;
- solve (4 warps): its own q / k ring, ``K K^T`` and ``Q K^T``, the ancestor mask ``M`` from the bitsets, the
  decays ``d_ij = scale Gamma_i / Gamma_j``, ``-A = (-beta / scale) K K^T ⊙ d ⊙ M°``, ``(I + A)^{-1}`` by
  doubling (the request's own count of rounds, from its largest depth; a round's two products issued together),
  ``TB = T diag(beta)`` and ``QKD = Q K^T ⊙ d`` handed over in fp16 through two shared tiles, one item ahead of
  the consumer;
- vectors (2 warps, one thread a node): ``log Gamma = M g`` (written out: the factors' ``log_gamma``; ``Gamma`` to
  the consumer) and the doubling count, an item ahead of the solve's use; with ``NORM``, ``rsqrt(|x|^2 + 1e-6)``
  of the q / k rows from the solve's ring, for the solve (row and column factors) and the consumer; ``k_rnorm``
  out.

Every buffer read with plain loads and then freed to a TMA producer is fenced (``fence_async_shared``) between
the reads and the free: an ``mbarrier`` arrive orders plain reads only for generic-proxy observers, not for the
TMA write that refills the buffer (without the fence the refill can overtake the reads: a race seen on the H200).
"""

from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from . import primitives

# Triton 3.6 and 3.9 name four Gluon builtins differently
_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
_reinterpret = getattr(gl.shared_memory_descriptor, "reinterpret", None) or gl.shared_memory_descriptor._reinterpret

NODES = 64  # the tile of tree nodes (N must be this)
LOG_NODES = gl.constexpr(NODES.bit_length() - 1)
BK = 16  # state rows a chunk
STAGES = 3  # the loader's ring
SOLVER_SLOTS = 2  # the solve's q / k ring
CONSUMER_WARPS = 8
SOLVER_REGS = 184  # verify 192.4-192.9 us at B = 64 (200: 199.6, the consumer 128 with 11 spill stores; 176: 207.0)
WORD_BITS = 32
# The deepest trees whose doubling may take fp16 operands (``FP16_DOUBLING``; deeper ones, and keys not normalised in
# the kernel, take tf32).
# With |A_ij| = |beta_i (Gamma_i / Gamma_j) k^_i . k^_j| <= 2 (beta <= 2, g <= 0, |k^| < 1), a node pair l levels
# apart has |(A^m)_ij| <= 2^m C(l - 1, m - 1) (chains through the path between them) and a partial sum of the
# powers at most 2 * 3^(l - 1): 39366 at l = 10, within fp16's 65504 (11: 118098). Checked by
# tests/test_gdn_fused.py::test_fp16_doubling_bound.
FP16_DOUBLING_MAX_DEPTH = gl.constexpr(10)
LOG2E = gl.constexpr(1.4426950408889634)
LOG_DECAY_FLOOR = gl.constexpr(primitives.LOG_DECAY_FLOOR.value)  # the portable kernels' floor on g


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _larger(a, b):
    return gl.maximum(a, b)


@gluon.jit
def _row_sum(x, axis: gl.constexpr):
    """``x.sum(axis)`` by ``gl.reduce`` with a Gluon combine function: ``gl.sum`` / ``gl.max`` call Triton's
    ``@triton.jit`` combines, which under ``TRITON_INTERPRET`` (the CPU tests' build of this kernel) are interpreter
    objects that Gluon's code generator rejects."""
    return gl.reduce(x, axis, _add)


@gluon.jit
def _nodes_of(num_nodes_ptr, b, N: gl.constexpr, HAS_NUM: gl.constexpr):
    """Request ``b``'s node count (``N`` without sizes)."""
    if HAS_NUM:
        n_b = gl.load(num_nodes_ptr + b)
    else:
        n_b = N
    return n_b


@gluon.jit
def _doubling_rounds(power, inv, levels, rows_smem, cols_smem, acc: gl.constexpr, a_op: gl.constexpr):
    """The rounds of :func:`_unit_lower_inverse` with operands in ``rows_smem``'s dtype (fp32 accumulators in
    ``acc``; ``a_op``: ``inv``'s A-operand layout for that dtype). Round ``l`` issues ``P_{l+1} = P_l P_l`` and
    ``inv <- inv + inv P_l`` together, both with ``P_l`` as the B operand: ``P_l`` waits in shared memory
    (``rows_smem`` row-major for the squaring's A operand, ``cols_smem`` column-major: the K-major B operand);
    ``inv`` is the A operand from registers."""
    power = gl.convert_layout(power, acc)
    inv = gl.convert_layout(inv, acc)
    if levels > 1:
        _barrier()
        rows_smem.store(power.to(rows_smem.dtype))
        cols_smem.permute((1, 0)).store(power.to(rows_smem.dtype))
        _barrier()
        fence_async_shared()
        power = warpgroup_mma(rows_smem, cols_smem.permute((1, 0)), power, use_acc=False)  # P_1
    for step in range(1, levels):
        _barrier()
        rows_smem.store(power.to(rows_smem.dtype))
        cols_smem.permute((1, 0)).store(power.to(rows_smem.dtype))
        _barrier()
        fence_async_shared()
        power = warpgroup_mma(rows_smem, cols_smem.permute((1, 0)), power, use_acc=False, is_async=True)
        inv = warpgroup_mma(gl.convert_layout(inv.to(rows_smem.dtype), a_op), cols_smem.permute((1, 0)), inv,
                            is_async=True)
        power, inv = warpgroup_mma_wait(0, deps=(power, inv))
    return inv + gl.where(levels > 1, power, 0.0)  # + P_levels, the last round's square


@gluon.jit
def _doubling_count(depth, LOG_N: gl.constexpr):
    """The rounds ``L`` of :func:`_unit_lower_inverse` for a tree's depths ``[N]`` (padding 0), in every entry: the
    least ``L >= 2`` with ``2^L >= `` the largest depth (``bit_length(depth - 1)``), 1 for trees at most one deep
    (``N = 2^LOG_N``, so a depth is below ``2^LOG_N``)."""
    depth_max = gl.reduce(depth, 0, _larger)
    levels = depth * 0  # [N] int32
    for e in gl.static_range(LOG_N):
        levels += (depth_max > (1 << e)).to(gl.int32)
    return gl.where(depth_max > 1, gl.maximum(levels, 2), 1)


@gluon.jit
def _unit_lower_inverse(power, rows, cols, cols_smem, rows_smem, levels, a_op: gl.constexpr,
                        FP16: gl.constexpr):
    """``(I + A)^{-1} = sum_{m <= 2^L} P^m`` from ``power = P = -A`` (``[N, N]``, in the layout ``a_op``'s
    parent), exact when the tree's depth is at most ``2^L`` (``A^(depth + 1) = 0``), ``L = levels``: ``inv`` starts
    as ``I + P``; after ``L`` rounds (:func:`_doubling_rounds`) it is ``prod_{l < L} (I + P^(2^l))``, the powers up
    to ``2^L - 1``, and the last round's square ``P^(2^L)`` is added (``L > 1``). Operands tf32, or with ``FP16``
    fp16 (rounded: the significand of tf32, which truncates; twice the tensor rate; the launch's trees no deeper
    than :data:`FP16_DOUBLING_MAX_DEPTH`, which bounds them). (A runtime choice between the two, per request,
    made the kernel 20 % slower.)"""
    N: gl.constexpr = power.shape[0]
    mma: gl.constexpr = a_op.parent
    acc16: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=mma.warps_per_cta,
                                                    instr_shape=[16, N, 16])
    a16: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc16, k_width=2)
    half: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    inv = gl.where(rows[:, None] == cols[None, :], 1.0, 0.0) + power  # I + P
    if not FP16:
        inv = _doubling_rounds(power, inv, levels, rows_smem, cols_smem, mma, a_op)
    else:
        inv = gl.convert_layout(_doubling_rounds(power, inv, levels, _reinterpret(rows_smem, gl.float16, [N, N], half),
                                                 _reinterpret(cols_smem, gl.float16, [N, N], half), acc16, a16), mma)
    return inv


@gluon.jit
def _loader(pool_desc, q_desc, k_desc, v_desc, kpt_desc, dp_desc, slots_ptr, s_ring, q_ring, k_ring, ready, empty,
            v_smem, kpt_smem, dp_smem, ep_ready, ep_empty, path_ready, path_empty, n_items, H: gl.constexpr,
            HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, N: gl.constexpr, BK: gl.constexpr,
            STAGES: gl.constexpr, PATH: gl.constexpr):
    """Streams every item's chunks into the ring, its slot's pending path tiles and its ``v``, as far ahead as the
    barriers allow. The path tiles are loaded after the item's first ``STAGES`` chunks: the consumer frees them at
    the end of the previous item's chunk loop (earlier would wait on it, later would deadlock)."""
    gl.static_assert(K > STAGES * BK, "the path tiles load inside the chunk loop")
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    chunk = 0
    count = 0
    for item in range(pid, n_items, nprog):
        b = item // HV
        hv = item % HV
        h = hv // (HV // H)
        pend = gl.load(slots_ptr + b) * HV + hv  # the item's row of the pool and of the pending commits
        for k0 in gl.static_range(0, K, BK):
            if k0 == STAGES * BK:
                mbarrier.wait(path_empty, (count & 1) ^ 1)
                mbarrier.expect(path_ready, kpt_desc.block_type.nbytes + dp_desc.block_type.nbytes)
                _tma_load(kpt_desc, [((pend // HV) * H + h) * K, 0], path_ready, kpt_smem)  # K^_p^T (key head)
                _tma_load(dp_desc, [(pend // HV) * PATH, hv * V], path_ready, dp_smem)  # diag(w) Delta_p
            s = chunk % STAGES
            mbarrier.wait(empty.index(s), ((chunk // STAGES) & 1) ^ 1)  # the first pass finds every slot free
            bar = ready.index(s)
            mbarrier.expect(bar, pool_desc.block_type.nbytes + 2 * q_desc.block_type.nbytes)
            _tma_load(pool_desc, [pend * K + k0, 0], bar, s_ring.index(s))
            _tma_load(q_desc, [b * N, h * K + k0], bar, q_ring.index(s))
            _tma_load(k_desc, [b * N, h * K + k0], bar, k_ring.index(s))
            chunk += 1
        mbarrier.wait(ep_empty, (count & 1) ^ 1)
        mbarrier.expect(ep_ready, v_desc.block_type.nbytes)
        _tma_load(v_desc, [b * N, hv * V], ep_ready, v_smem)
        count += 1


@gluon.jit
def _consumer(pool_desc, delta_desc, o_desc, slots_ptr, ga_ptr, active_ptr, num_nodes_ptr, s_ring, q_ring, k_ring,
              ready, empty, v_smem, o_smem, kpt_smem, dp_smem, ep_ready, ep_empty, path_ready, path_empty, tb2, qkd2,
              tb_ready, tb_empty, vec2, gvec, scale, n_items, HV: gl.constexpr, K: gl.constexpr,
              V: gl.constexpr, N: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr, WARPS: gl.constexpr,
              NORM: gl.constexpr, HAS_NUM: gl.constexpr):
    """The state stream and the epilogue of every item, transposed (rows: value columns, columns: nodes). Padding
    nodes' columns of ``X`` are zeroed before any product (their inputs may be NaN), and of ``Delta`` / ``O``
    before the stores."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, N, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=1)
    mma16: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                    instr_shape=[16, N, 16])  # the fp16 epilogue products
    a16: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma16, k_width=2)
    mma_bk: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                     instr_shape=[16, BK, 8])  # the path update of a chunk
    a_bk: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_bk, k_width=1)
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    chunk = 0
    count = 0
    pend_next = gl.load(slots_ptr + pid // HV, mask=pid < n_items, other=0) * HV + pid % HV  # loaded an item early
    for item in range(pid, n_items, nprog):
        b = item // HV
        hv = item % HV
        pend = pend_next
        active = gl.load(active_ptr + pend) != 0
        gamma_a = gl.where(active, gl.load(ga_ptr + pend), 1.0)
        ks = gl.zeros([V, N], gl.float32, mma)  # [V, N] (K S0)^T
        qs = gl.zeros([V, N], gl.float32, mma)  # [V, N] (Q S0)^T
        mbarrier.wait(path_ready, count & 1)
        dp_t = dp_smem.permute((1, 0)).load(a_bk) * gl.where(active, 1.0, 0.0)  # [V, PATH] Delta_p^T (0: none)
        for k0 in gl.static_range(0, K, BK):
            s = chunk % STAGES
            mbarrier.wait(ready.index(s), (chunk // STAGES) & 1)
            s_t = s_ring.index(s).permute((1, 0)).load(a_op)  # [V, BK] S^T chunk
            upd = warpgroup_mma(dp_t, kpt_smem.slice(k0, BK).permute((1, 0)),
                                gl.zeros([V, BK], gl.float32, mma_bk), use_acc=False)  # [V, BK] (kpt dp)^T
            s_t = s_t * gamma_a + gl.convert_layout(upd, a_op)  # the pending commit applied
            _barrier()
            s_ring.index(s).permute((1, 0)).store(s_t)
            _barrier()
            fence_async_shared()  # (also orders the slot's plain loads before its refill)
            ks = warpgroup_mma(s_t, k_ring.index(s).permute((1, 0)), ks, is_async=True)
            qs = warpgroup_mma(s_t, q_ring.index(s).permute((1, 0)), qs, is_async=True)
            _tma_store(pool_desc, [pend * K + k0, 0], s_ring.index(s))  # written back in place
            ks, qs = warpgroup_mma_wait(0, deps=(ks, qs))
            tma.store_wait(0)
            mbarrier.arrive(empty.index(s))
            chunk += 1
        _barrier()
        mbarrier.arrive(path_empty)  # the path tiles have served their last chunk (Delta_p^T is in registers)
        gl.store(active_ptr + pend, 0)  # applied: this item owns its entry
        nxt = item + nprog
        pend_next = gl.load(slots_ptr + nxt // HV, mask=nxt < n_items, other=0) * HV + nxt % HV
        nodes = gl.arange(0, N, layout=gl.SliceLayout(0, mma))  # [N]
        real = nodes < _nodes_of(num_nodes_ptr, b, N, HAS_NUM)  # [N]
        mbarrier.wait(ep_ready, count & 1)
        mbarrier.wait(tb_ready.index(count % 2), (count // 2) & 1)
        gam = gvec.index(count % 4).load(gl.SliceLayout(0, mma))  # [N] Gamma, from the solve
        if NORM:  # the keys' and queries' row factors rk, rq from the solve's hand-over
            rk = vec2.index(2 * (count % 2)).load(gl.SliceLayout(0, mma))  # [N]
            rq = vec2.index(2 * (count % 2) + 1).load(gl.SliceLayout(0, mma))  # [N]
            x_t = v_smem.permute((1, 0)).load(mma) - ks * (gam * rk)[None, :]  # [V, N] (V - Gamma K^ S0)^T
            qs = qs * (gam * scale * rq)[None, :]  # [V, N] (scale Gamma Q^ S0)^T
        else:
            x_t = v_smem.permute((1, 0)).load(mma) - ks * gam[None, :]  # [V, N] (V - Gamma K S0)^T
            qs = qs * (gam * scale)[None, :]
        x_t = gl.where(real[None, :], x_t, 0.0)
        _barrier()
        fence_async_shared()
        delta_t = warpgroup_mma(gl.convert_layout(x_t.to(gl.float16), a16), tb2.index(count % 2).permute((1, 0)),
                                gl.convert_layout(ks, mma16), use_acc=False, is_async=True)
        delta_t = warpgroup_mma_wait(0, deps=(delta_t, ))  # [V, N] Delta^T = X^T TB^T
        o_t = warpgroup_mma(gl.convert_layout(delta_t.to(gl.float16), a16), qkd2.index(count % 2).permute((1, 0)),
                            gl.convert_layout(qs, mma16), is_async=True)  # [V, N] O^T
        delta_t = gl.where(real[None, :], gl.convert_layout(delta_t, mma), 0.0)
        _barrier()
        delta_smem = _reinterpret(v_smem, gl.float16, [N, V], delta_desc.layout)  # (v is in registers)
        delta_smem.permute((1, 0)).store(delta_t.to(gl.float16))  # Delta leaves in fp16 through v's buffer
        _barrier()
        fence_async_shared()
        _tma_store(delta_desc, [b * N, hv * V], delta_smem)
        o_t = warpgroup_mma_wait(0, deps=(o_t, ))
        o_t = gl.where(real[None, :], gl.convert_layout(o_t, mma), 0.0)
        mbarrier.arrive(tb_empty.index(count % 2))
        tma.store_wait(1)  # the previous item's O store has read o_smem
        _barrier()
        o_smem.permute((1, 0)).store(o_t)
        _barrier()
        fence_async_shared()
        _tma_store(o_desc, [b * N, hv * V], o_smem)
        tma.store_wait(1)  # Delta's store has read v's buffer
        mbarrier.arrive(ep_empty)
        count += 1
    tma.store_wait(0)


@gluon.jit
def _solver(q_desc, k_desc, beta_ptr, words_ptr, num_nodes_ptr, sq_ring, sk_ring, sready, sfree, solve_smem,
            rows_smem, tb2, qkd2, tb_ready, tb_empty, vec2, nvec, lvl, norm_ready, norm_empty, scale, n_items,
            H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, N: gl.constexpr, BK: gl.constexpr,
            W: gl.constexpr, SLOTS: gl.constexpr, NORM: gl.constexpr, HAS_NUM: gl.constexpr,
            FP16_DOUBLING: gl.constexpr):
    """Each item's ``TB`` / ``QKD`` one item ahead of the consumer, from its own q / k ring (the next item's first
    chunks loaded during this item's doubling); the item's vectors (``log2 Gamma`` with ``scale`` / ``rk`` in it,
    the norms' factors, the doubling count) come from the vector partition (``nvec``, ``lvl``). ``scale`` rides in
    the exponent: ``d = scale D``, ``QKD = Q K^T ⊙ d``, ``-A = (-beta / scale) K K^T ⊙ d ⊙ M°``; with ``NORM`` the
    column factor ``rk_j`` too (``d = scale D diag(rk)``), the row factors multiply (``diag(rq)`` on ``QKD``,
    ``diag(rk)`` on ``-A``). Padding nodes (past the request's ``num_nodes``) are masked out of ``-A``, ``QKD`` and
    ``diag(beta)`` by selection (their inputs may be NaN), so their rows of ``T`` are the identity's and their
    columns 0."""
    mma_nn: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, N, 8])
    a_nn: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_nn, k_width=1)
    CHUNKS: gl.constexpr = K // BK
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    if pid < n_items:  # the first item's first chunks
        h0 = (pid % HV) // (HV // H)
        for c in gl.static_range(SLOTS):
            mbarrier.expect(sready.index(c), 2 * q_desc.block_type.nbytes)
            _tma_load(q_desc, [(pid // HV) * N, h0 * K + c * BK], sready.index(c), sq_ring.index(c))
            _tma_load(k_desc, [(pid // HV) * N, h0 * K + c * BK], sready.index(c), sk_ring.index(c))
    count = 0
    sc = 0
    for item in range(pid, n_items, nprog):
        b = item // HV
        hv = item % HV
        h = hv // (HV // H)
        nxt = item + nprog
        rows = gl.arange(0, N, layout=gl.SliceLayout(1, mma_nn))  # [N]
        cols = gl.arange(0, N, layout=gl.SliceLayout(0, mma_nn))  # [N]
        n_b = _nodes_of(num_nodes_ptr, b, N, HAS_NUM)
        beta_r = gl.load(beta_ptr + ((b * N + rows) * HV + hv))  # [N]
        kk = gl.zeros([N, N], gl.float32, mma_nn)  # [N, N] K K^T
        qk = gl.zeros([N, N], gl.float32, mma_nn)  # [N, N] Q K^T
        for c in gl.static_range(CHUNKS):
            slot = (sc + c) % SLOTS  # the ring runs across items: sc counts the chunks consumed before this item
            mbarrier.wait(sready.index(slot), ((sc + c) // SLOTS) & 1)
            k_t = sk_ring.index(slot).permute((1, 0))  # [BK, N] K^T chunk, K-major
            kk = warpgroup_mma(sk_ring.index(slot), k_t, kk, is_async=True)
            qk = warpgroup_mma(sq_ring.index(slot), k_t, qk, is_async=True)
            kk, qk = warpgroup_mma_wait(0, deps=(kk, qk))
            _barrier()
            if NORM:  # the vector partition has read the slot too
                mbarrier.wait(sfree.index(slot), ((sc + c) // SLOTS) & 1)
            if c + SLOTS < CHUNKS:  # this item's chunk c + SLOTS into the freed slot
                mbarrier.expect(sready.index(slot), 2 * q_desc.block_type.nbytes)
                _tma_load(q_desc, [b * N, h * K + (c + SLOTS) * BK], sready.index(slot), sq_ring.index(slot))
                _tma_load(k_desc, [b * N, h * K + (c + SLOTS) * BK], sready.index(slot), sk_ring.index(slot))
            elif nxt < n_items:  # the next item's chunk c + SLOTS - CHUNKS, loaded while this item's doubling runs
                h_n = (nxt % HV) // (HV // H)
                mbarrier.expect(sready.index(slot), 2 * q_desc.block_type.nbytes)
                _tma_load(q_desc, [(nxt // HV) * N, h_n * K + (c + SLOTS - CHUNKS) * BK], sready.index(slot),
                          sq_ring.index(slot))
                _tma_load(k_desc, [(nxt // HV) * N, h_n * K + (c + SLOTS - CHUNKS) * BK], sready.index(slot),
                          sk_ring.index(slot))
        sc += CHUNKS
        beta_c = gl.load(beta_ptr + ((b * N + cols) * HV + hv))  # [N]
        word = gl.load(words_ptr + ((b * N + rows[:, None]) * W + cols[None, :] // 32))  # [N, N] int32
        anc = (((word >> (cols[None, :] % 32)) & 1) != 0) & (rows[:, None] < n_b) & (cols[None, :] < n_b)  # [N, N] M
        beta_c = gl.where(cols < n_b, beta_c, 0.0)  # [N]
        row_a = -beta_r / scale  # [N] -A's row factor
        par = count % 2
        mbarrier.wait(norm_ready.index(par), (count // 2) & 1)  # the vector partition's, loaded in the layouts used
        lg_r = nvec.index(4 * par + 2).load(gl.SliceLayout(1, mma_nn))  # [N] log2(scale Gamma_i)
        lg_c = nvec.index(4 * par + 3).load(gl.SliceLayout(0, mma_nn))  # [N] log2(Gamma_j / rk_j)
        levels = gl.reduce(lvl.index(par).load(gl.SliceLayout(1, mma_nn)), 0, _larger)  # (every entry the count)
        if NORM:
            rk_r = nvec.index(4 * par).load(gl.SliceLayout(1, mma_nn))  # [N] rows
            rq_r = nvec.index(4 * par + 1).load(gl.SliceLayout(1, mma_nn))  # [N] rows
            row_a = row_a * rk_r
        decay = gl.exp2(gl.where(anc, lg_r[:, None] - lg_c[None, :], float("-inf")))  # [N, N] d (0 off the paths)
        power = gl.where(anc & (rows[:, None] != cols[None, :]), kk * decay * row_a[:, None], 0.0)  # -A
        if NORM:
            qk = gl.where(anc, qk * decay * rq_r[:, None], 0.0)  # QKD = diag(rq) scale Q K^T ⊙ D
        else:
            qk = gl.where(anc, qk * decay, 0.0)  # QKD = scale Q K^T ⊙ D
        buf = count % 2
        mbarrier.wait(tb_empty.index(buf), ((count // 2) & 1) ^ 1)  # the consumer is done with item count - 2's
        qkd2.index(buf).store(qk.to(qkd2.dtype))  # (before the doubling: QKD's registers free for it)
        inv = _unit_lower_inverse(power, rows, cols, solve_smem, rows_smem, levels, a_nn, FP16_DOUBLING)
        tb2.index(buf).store((inv * beta_c[None, :]).to(tb2.dtype))  # TB = (I + A)^{-1} diag(beta)
        if NORM:  # reloaded here rather than kept live across the doubling
            vec2.index(2 * buf).store(nvec.index(4 * buf).load(gl.SliceLayout(0, mma_nn)))
            vec2.index(2 * buf + 1).store(nvec.index(4 * buf + 1).load(gl.SliceLayout(0, mma_nn)))
        _barrier()
        fence_async_shared()
        mbarrier.arrive(tb_ready.index(buf))
        mbarrier.arrive(norm_empty.index(buf))
        count += 1


@gluon.jit
def _vectors(sq_ring, sk_ring, sready, sfree, nvec, lvl, gvec, norm_ready, norm_empty, g_ptr, words_ptr, depth_ptr,
             log_gamma_ptr, k_rnorm_ptr, num_nodes_ptr, scale, n_items, H: gl.constexpr, HV: gl.constexpr,
             N: gl.constexpr, K: gl.constexpr, BK: gl.constexpr, W: gl.constexpr, SLOTS: gl.constexpr,
             NW: gl.constexpr, NORM: gl.constexpr, HAS_NUM: gl.constexpr):
    """Each item's per-node vectors, one thread a node, into ``nvec [2 items, 4, N]`` for the solve (``norm_ready``
    / ``norm_empty``): first ``log Gamma = M g`` (the row's ancestor bits times ``g``; written to ``log_gamma [B, N,
    HV]``, ``Gamma`` to the consumer's ``gvec`` ring) and the doubling count (``bit_length`` of the request's largest
    depth, ``lvl``), while the solve still works on the item before; then, with ``NORM``, every q / k chunk of the
    solve's ring beside it (each slot freed to the solve's refill by ``sfree``, after a proxy fence): fp32 sums of
    squares, ``rk``, ``rq = rsqrt(|x|^2 + 1e-6)``; ``k_rnorm [B, N, H]`` written by the first value head of each
    group. ``nvec`` rows: ``rk``, ``rq``, ``log2(scale Gamma)`` and ``log2(Gamma / rk)``. Padding nodes (past
    ``num_nodes``): ``log Gamma`` 0, ``g`` and depths not read."""
    rows_l: gl.constexpr = gl.BlockedLayout([1, BK], [32, 1], [NW, 1], [1, 0])  # [N, BK]: whole rows a thread
    CHUNKS: gl.constexpr = K // BK
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    nodes = gl.arange(0, N, layout=gl.SliceLayout(1, rows_l))  # [N]
    sc = 0
    count = 0
    for item in range(pid, n_items, nprog):
        b = item // HV
        hv = item % HV
        par = count % 2
        n_b = _nodes_of(num_nodes_ptr, b, N, HAS_NUM)
        mbarrier.wait(norm_empty.index(par), ((count // 2) & 1) ^ 1)  # the solve has read item count - 2's
        log_gamma = gl.zeros([N], gl.float32, gl.SliceLayout(1, rows_l))  # [N]
        for c0 in gl.static_range(0, N, BK):  # the ancestor mask BK columns at a time
            cols = c0 + gl.arange(0, BK, layout=gl.SliceLayout(0, rows_l))  # [BK]
            g_c = gl.load(g_ptr + ((b * N + cols) * HV + hv), mask=cols < n_b, other=0.0)  # [BK]
            g_c = gl.where(g_c > LOG_DECAY_FLOOR, g_c, LOG_DECAY_FLOOR)  # -inf held at a finite 0-decay
            word = gl.load(words_ptr + ((b * N + nodes) * W + c0 // 32), mask=nodes < n_b, other=0)  # [N] int32
            anc = ((word[:, None] >> (cols[None, :] % 32)) & 1) != 0  # [N, BK] M
            log_gamma += _row_sum(gl.where(anc, g_c[None, :], 0.0), 1)
        gl.store(log_gamma_ptr + ((b * N + nodes) * HV + hv), log_gamma)
        gvec.index(count % 4).store(gl.exp(log_gamma))  # Gamma for the consumer (its item count - 4 is done)
        depth = gl.load(depth_ptr + b * N + nodes, mask=nodes < n_b, other=0)  # [N]
        lvl.index(par).store(_doubling_count(depth, LOG_NODES))
        lg2 = log_gamma * LOG2E  # [N]
        nvec.index(4 * par + 2).store(lg2 + gl.log2(scale))
        if NORM:
            k_sq = gl.zeros([N], gl.float32, gl.SliceLayout(1, rows_l))  # [N] |k_i|^2
            q_sq = gl.zeros([N], gl.float32, gl.SliceLayout(1, rows_l))  # [N] |q_i|^2
            for c in gl.static_range(CHUNKS):
                slot = (sc + c) % SLOTS
                mbarrier.wait(sready.index(slot), ((sc + c) // SLOTS) & 1)
                k_c = sk_ring.index(slot).load(rows_l)  # [N, BK] both loads before the sums
                q_c = sq_ring.index(slot).load(rows_l)  # [N, BK]
                k_sq += _row_sum(k_c * k_c, 1)
                q_sq += _row_sum(q_c * q_c, 1)
                _barrier()  # every lane's loads done before the one-thread arrive,
                fence_async_shared()  # and ordered before the refill's TMA write (another proxy)
                mbarrier.arrive(sfree.index(slot))
            sc += CHUNKS
            rk = gl.rsqrt(k_sq + 1e-6)  # [N]
            nvec.index(4 * par).store(rk)
            nvec.index(4 * par + 1).store(gl.rsqrt(q_sq + 1e-6))
            nvec.index(4 * par + 3).store(lg2 - gl.log2(rk))  # the column factor in the exponent
        else:
            nvec.index(4 * par + 3).store(lg2)
        _barrier()
        mbarrier.arrive(norm_ready.index(par))
        if NORM:
            if hv % (HV // H) == 0:  # (0 on padding nodes)
                gl.store(k_rnorm_ptr + (b * N + nodes) * H + hv // (HV // H), gl.where(nodes < n_b, rk, 0.0))
        count += 1


@gluon.jit
def _fused_verify_kernel(pool_desc, q_desc, k_desc, v_desc, delta_desc, o_desc, kpt_desc, dp_desc, slots_ptr, ga_ptr,
                         active_ptr, beta_ptr, g_ptr, words_ptr, depth_ptr, log_gamma_ptr, k_rnorm_ptr, num_nodes_ptr,
                         scale, n_items,
                         H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, N: gl.constexpr,
                         PATH: gl.constexpr, W: gl.constexpr, NORM: gl.constexpr, BK: gl.constexpr,
                         STAGES: gl.constexpr, SLOTS: gl.constexpr, WARPS: gl.constexpr, SOLVER_REGS: gl.constexpr,
                         HAS_NUM: gl.constexpr, FP16_DOUBLING: gl.constexpr):
    """The fused verify: shared buffers, barriers and the partitions (module docstring)."""
    s_ring = gl.allocate_shared_memory(gl.float32, [STAGES, BK, V], pool_desc.layout)
    q_ring = gl.allocate_shared_memory(gl.float32, [STAGES, N, BK], q_desc.layout)
    k_ring = gl.allocate_shared_memory(gl.float32, [STAGES, N, BK], k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.float32, [N, V], v_desc.layout)
    o_smem = gl.allocate_shared_memory(gl.float32, [N, V], o_desc.layout)
    kpt_smem = gl.allocate_shared_memory(gl.float32, [K, PATH], kpt_desc.layout)
    dp_smem = gl.allocate_shared_memory(gl.float32, [PATH, V], dp_desc.layout)
    wide: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)
    half: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    tb2 = gl.allocate_shared_memory(gl.float16, [2, N, N], half)
    qkd2 = gl.allocate_shared_memory(gl.float16, [2, N, N], half)
    solve_smem = gl.allocate_shared_memory(gl.float32, [N, N], wide)
    rows_smem = gl.allocate_shared_memory(gl.float32, [N, N], wide)
    sq_ring = gl.allocate_shared_memory(gl.float32, [SLOTS, N, BK], q_desc.layout)
    sk_ring = gl.allocate_shared_memory(gl.float32, [SLOTS, N, BK], k_desc.layout)
    vec2 = gl.allocate_shared_memory(gl.float32, [4, N], flat)  # rk, rq for the consumer, two items
    gvec = gl.allocate_shared_memory(gl.float32, [4, N], flat)  # Gamma for the consumer, four items (written
    # for item c once the solve has read item c - 2's vectors, after its wait for the consumer to finish c - 4)
    nvec = gl.allocate_shared_memory(gl.float32, [8, N], flat)  # the solve's vectors, two items
    lvl = gl.allocate_shared_memory(gl.int32, [2, N], flat)  # the doubling count, two items
    bar1: gl.constexpr = mbarrier.MBarrierLayout()
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar1)
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar1)
    sready = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], bar1)
    sfree = gl.allocate_shared_memory(gl.int64, [SLOTS, 1], bar1)
    tb_ready = gl.allocate_shared_memory(gl.int64, [2, 1], bar1)
    tb_empty = gl.allocate_shared_memory(gl.int64, [2, 1], bar1)
    norm_ready = gl.allocate_shared_memory(gl.int64, [2, 1], bar1)
    norm_empty = gl.allocate_shared_memory(gl.int64, [2, 1], bar1)
    ep_ready = gl.allocate_shared_memory(gl.int64, [1], bar1)
    ep_empty = gl.allocate_shared_memory(gl.int64, [1], bar1)
    path_ready = gl.allocate_shared_memory(gl.int64, [1], bar1)
    path_empty = gl.allocate_shared_memory(gl.int64, [1], bar1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(SLOTS):
        mbarrier.init(sready.index(i), count=1)
        mbarrier.init(sfree.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(tb_ready.index(i), count=1)
        mbarrier.init(tb_empty.index(i), count=1)
        mbarrier.init(norm_ready.index(i), count=1)
        mbarrier.init(norm_empty.index(i), count=1)
    mbarrier.init(ep_ready, count=1)
    mbarrier.init(ep_empty, count=1)
    mbarrier.init(path_ready, count=1)
    mbarrier.init(path_empty, count=1)
    fence_async_shared()
    # (the partitions' arguments are written in the call: a tuple variable would turn constexprs into tensors)
    gl.warp_specialize([
        (_consumer, (pool_desc, delta_desc, o_desc, slots_ptr, ga_ptr, active_ptr, num_nodes_ptr, s_ring, q_ring,
                     k_ring, ready, empty, v_smem, o_smem, kpt_smem, dp_smem, ep_ready, ep_empty, path_ready,
                     path_empty, tb2, qkd2, tb_ready, tb_empty, vec2, gvec, scale, n_items, HV, K, V, N, BK, STAGES,
                     WARPS, NORM, HAS_NUM)),
        (_loader, (pool_desc, q_desc, k_desc, v_desc, kpt_desc, dp_desc, slots_ptr, s_ring, q_ring, k_ring, ready,
                   empty, v_smem, kpt_smem, dp_smem, ep_ready, ep_empty, path_ready, path_empty, n_items, H, HV, K, V,
                   N, BK, STAGES, PATH)),
        (_solver, (q_desc, k_desc, beta_ptr, words_ptr, num_nodes_ptr, sq_ring, sk_ring, sready, sfree, solve_smem,
                   rows_smem, tb2, qkd2, tb_ready, tb_empty, vec2, nvec, lvl, norm_ready, norm_empty, scale, n_items,
                   H, HV, K, N, BK, W, SLOTS, NORM, HAS_NUM, FP16_DOUBLING)),
        (_vectors, (sq_ring, sk_ring, sready, sfree, nvec, lvl, gvec, norm_ready, norm_empty, g_ptr, words_ptr,
                    depth_ptr, log_gamma_ptr, k_rnorm_ptr, num_nodes_ptr, scale, n_items, H, HV, N, K, BK, W, SLOTS,
                    2, NORM, HAS_NUM)),
    ], [1, 4, 2], [40, SOLVER_REGS, 48])


def _layout(block, dtype):
    return gl.NVMMASharedLayout.get_default_for(block, dtype)


def descriptors(state_pool, q, k, v, o, delta, kpt, dp) -> tuple:
    """TMA descriptors over 2-D views: the pool ``[P HV K, V]``, q / k ``[B N, H K]``, v / Delta (fp16) / o ``[B N,
    HV V]``, the pending ``kpt [P H K, PATH]`` and ``dp [P PATH, HV V]``."""
    B, N, H, K = q.shape
    HV, V = v.shape[2:]
    path = kpt.shape[-1]
    f32 = gl.float32
    pool2 = state_pool.view(-1, V)
    q2, k2 = (t.as_strided((B * N, H * K), (t.stride(1), 1)) for t in (q, k))  # node rows (fused.node_rows_addressable)
    v2 = v.as_strided((B * N, HV * V), (v.stride(1), 1))
    d2, o2 = (t.view(B * N, HV * V) for t in (delta, o))
    return (TensorDescriptor.from_tensor(pool2, [BK, V], _layout([BK, V], f32)),
            TensorDescriptor.from_tensor(q2, [N, BK], _layout([N, BK], f32)),
            TensorDescriptor.from_tensor(k2, [N, BK], _layout([N, BK], f32)),
            TensorDescriptor.from_tensor(v2, [N, V], _layout([N, V], f32)),
            TensorDescriptor.from_tensor(d2, [N, V], _layout([N, V], gl.float16)),
            TensorDescriptor.from_tensor(o2, [N, V], _layout([N, V], f32)),
            TensorDescriptor.from_tensor(kpt.view(-1, path), [K, path], gl.NVMMASharedLayout(64, 32, 2)),
            TensorDescriptor.from_tensor(dp.view(-1, HV * V), [path, V], _layout([path, V], f32)))


def build_for_sm90(*, H: int = 16, HV: int = 32, K: int = 128, V: int = 128, norm: bool = True, sizes: bool = True,
                   fp16_doubling: bool = True, pool_slots: int = 2, requests: int = 2):
    """Compiles the fused kernel for sm_90 without a GPU (the tests' check that it builds where CI has none):
    returns Triton's compiled kernel (``.asm``, ``.metadata``)."""
    import torch  # noqa: PLC0415
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.experimental.gluon._runtime import GluonASTSource  # noqa: PLC0415
    from triton.runtime.jit import mangle_type  # noqa: PLC0415

    from .pending import PATH_NODES  # noqa: PLC0415
    B, N = requests, NODES
    pool = torch.zeros(pool_slots, HV, K, V)
    q = torch.zeros(B, N, H, K)
    v = torch.zeros(B, N, HV, V)
    descs = descriptors(pool, q, q, v, v, v.half(), torch.zeros(pool_slots, H, K, PATH_NODES),
                        torch.zeros(pool_slots, PATH_NODES, HV, V))
    names = ("pool_desc", "q_desc", "k_desc", "v_desc", "delta_desc", "o_desc", "kpt_desc", "dp_desc")
    signature = {n: mangle_type(d) for n, d in zip(names, descs)}
    signature.update(slots_ptr="*i32", ga_ptr="*fp32", active_ptr="*i32", beta_ptr="*fp32", g_ptr="*fp32",
                     words_ptr="*i32", depth_ptr="*i32", log_gamma_ptr="*fp32", k_rnorm_ptr="*fp32",
                     num_nodes_ptr="*i32", scale="fp32", n_items="i32")
    constexprs = dict(H=H, HV=HV, K=K, V=V, N=N, PATH=PATH_NODES, W=(N + WORD_BITS - 1) // WORD_BITS, NORM=norm,
                      BK=BK, STAGES=STAGES, SLOTS=SOLVER_SLOTS, WARPS=CONSUMER_WARPS, SOLVER_REGS=SOLVER_REGS,
                      HAS_NUM=sizes, FP16_DOUBLING=fp16_doubling)
    signature.update({n: "constexpr" for n in constexprs})
    return triton.compile(GluonASTSource(_fused_verify_kernel, signature, constexprs),
                          target=GPUTarget("cuda", 90, 64), options=dict(num_warps=CONSUMER_WARPS))
