"""Thirtieth session: can a warp-specialised Gluon kernel (Triton 3.6's ``triton.experimental.gluon``) stream the
GDN verify's bytes, fold in the previous step's commit and hide the solve, within issue 5's 2x allowance?
B = 64, N = 64, random data, tf32 products (hardware truncation, as the Triton stand-in), fp32 inputs, one H200.

Runs 66-69 (``../2026-12-03f/apply_probe.py``) found the Triton apply latency-bound: a stand-in with the apply's
arithmetic (``full``: ``Delta = TB (V - K S0)``, ``O = Q S0 + QKD Delta``, no rounding, decays or norms) takes
152-154 µs against 102 µs for its bytes at the copy rate. Here the same math runs in one persistent Gluon kernel
(one program per SM, items = (request, value head)), at these stages (``FOLD``):

- ``full`` (0), ``fold`` (1: each state chunk also written back, no Delta stored) and ``commit`` (2: each state
  chunk becomes ``gamma_a S + K_p^T diag(w) Delta_p`` for a previous accepted path of ``P`` nodes before it is
  used and written back; Delta stored): the Triton stand-in's stages of the same names, same data, same checks;
- ``fused`` (3): ``commit`` with a stand-in solve in line, from the same q / k chunks: ``K K^T``, ``Q K^T``,
  ``A = diag(beta) (K K^T ⊙ M°)``, ``(I + A)^{-1}`` by ``L`` doubling steps, ``TB``, ``QKD`` (mask: chains of
  ``BLOCK`` nodes; no decays), then the epilogue with them;
- ``overlap`` (4): ``commit`` with that solve in a 4-warp partition of its own reading the same ring slots, its
  result not handed over (what running beside the stream costs);
- ``ahead`` (6) / ``ahead-smem`` (7): the fused data flow: the solve partition loads its own q / k chunks, runs
  ahead of the stream and hands ``TB`` / ``QKD`` over through two shared tiles (``_solver_ahead``); 7 keeps every
  doubling operand in shared memory instead of converting register layouts;
- ``real`` (8) / ``real-rows`` (9): ``ahead-smem`` with the tree's own math in the solve partition (the
  benchmark's random trees: ancestor bitsets, ``logGamma = M g``, decays, ``beta``, ``QKD``, ``Gamma`` handed to
  the consumer), checked against the library's float64 closed form; 9 loads each row's bitset words once instead
  of a word per ``[N, N]`` element, and loads the item's words, gates and ``beta`` before its Gram products so
  their latency hides under them (built and compiled, never run: no device time was left);
- thirty-first session: ``real-lg`` (10) takes ``log2 Gamma`` from ``_log2_gamma_kernel`` (one program per
  request, timed with the kernel) instead of the solve's masked row sum; 11 with 9's row words; ``real-norm`` (12)
  L2-normalises q / k in the kernel; ``real-lean`` (13) / ``real-lean-norm`` (14) keep fewer tiles live in the
  solve; ``real-lg-half`` (15) hands ``TB`` / ``QKD`` over in fp16 (fp16 epilogue products, fp32 accumulation)
  and stores O by TMA from the freed shared memory; 16 / 17 give the solver a q / k ring of 3 / 4 slots; 18 / 19
  issue each path update one chunk ahead; 20 / 22-25 normalise q / k in the kernel (25 in a 1-warp partition of
  its own, ``_norm_warp``: built, never run); 21 prefetches two per-item loads (the best form: 181.8-182.9 µs);
  26 takes the path operand ``(diag(w) K_p)^T`` prepared per item. ``--trace`` adds one launch of each variant
  that records the SM's cycle counter per phase (``_stamp``). Runs 78-84;
- thirty-second session (runs 85-89): 25 ran (203.4 µs) with o off by 1.4-1.7e-3; 27 gives the norm partition 2
  warps reading whole ``[N, BK]`` chunks, 28 adds 26's prepared path operand (the best normalising form: 189.8-192.2
  µs, errors as without norms); ``--rows`` (run 87) showed 25 / 27's misses as rows of o scaled by 1-4 %: a q norm
  summed over a chunk read after its refill had landed, because the last q loads were still in flight at the slot's
  free and nothing ordered those generic-proxy reads before the refill's TMA write (the fix: ``fence_async_shared``
  before the free; run 88); 29 issues each chunk's products before its write-back (191.8 µs), 30 / 31 write the
  updated chunks back from registers by plain stores (196.0 / 184.4 µs): both dropped. The normalising stages'
  inputs have rows of random norms since run 86 (a norm read from the wrong row shows). 32 sums the norms from
  global memory (207.0-209.2 µs), 33 moves registers from the loader / norm partition to the solve (191.6-192.3);
  34 stages each updated chunk in a tile of its own (tb16's bytes), its TMA store awaited a chunk later, the
  products issued first (built; ``run92.sh`` prepared, not run: the session's device time was spent).

Partitions: a 1-warp loader streams each item's ``S0`` / q / k chunks by TMA through a ring of ``STAGES`` slots
(and the path rows and epilogue tiles), running ahead across items; the consumer (8 warps) does every product
transposed, because ``wgmma`` takes tf32 shared-memory operands K-major only: ``(K S0)^T = S0^T K^T`` with
``S0^T`` loaded into registers (A operand) and ``K^T`` the K-major view of the q / k tiles as stored, then
``Delta^T = X^T TB^T``, ``O^T = (Q S0)^T + Delta^T QKD^T``.

Every output (o, Delta, and for the committing stages the pool) is checked against float64 torch
(``apply_probe._want`` / ``_committed``, ``fused_scratch``) on NaN-poisoned tensors in the same run, beside the
Triton stand-in's ``full`` / ``fold`` / ``commit`` and fla-core 0.6.0's decode step (the 2x allowance). Runs 70-77
grew the script (70: full, fold, commit; 71: fused; 72: overlap; 73: ahead; 74: ahead-smem; 75: path length,
register budgets, repeats; 76, 77: ``--variants``, 77 with ``real``); ``VARIANTS`` is run 75's list. After run 77
the stand-in solve and the doubling became ``_stand_in_minus_a`` / ``_unit_lower_inverse`` (the PTX of every stage
compiled for sm_90 is instruction for instruction the same as before, debug info aside) and fla's step moved into
``apply_probe.fla_allowance``; untimed since.

Run: ``PYTHONPATH=$PWD:$PWD/bench:<fla> python bench/results/2026-12-03g/gluon_probe.py [--out PATH]``;
``--smoke`` checks the first variant once; ``--compile-only`` builds every variant for sm_90 without a GPU and
prints cuobjdump's resource use (under Triton 3.6 or 3.9: ``_barrier``, ``_tma_load``, ``_tma_store`` alias the
builtins 3.9 renamed; the resources are 3.6's only under 3.6).
"""
import argparse
import json
import os
import sys

import torch
import triton
import triton.language as tl
from lumotree.optimized import gdn_tree_ref as R
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "2026-12-03f"))
sys.path.insert(0, os.path.join(HERE, "..", "2026-12-03e"))

H, HV, K, V = 16, 32, 128, 128
PATH = 16  # the previous step's accepted path, padded (as apply_probe.PATH)
BLOCK, DOUBLINGS = 16, 4  # the fused stage's stand-in tree: chains of 16 nodes, so (I + A)^{-1} takes 4 doublings
# Triton 3.6 (the GPU machine) and 3.9 (this machine) name three Gluon builtins differently
_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global


_NEW_REINTERPRET = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))  # 3.9; 3.6: _reinterpret
SOLVER_REGS = 152  # FOLD >= 4: registers of the solve partition (the consumer gets what the loader and it leave)


@gluon.jit
def _stamp(trace_ptr, role, count, phase, TRACE: gl.constexpr):
    """``TRACE``: the SM's cycle counter into ``trace [programs, 2, 32, 16]`` at (program, role (0 solver, 1
    consumer), the program's item count, phase); every thread of the partition writes, the last one stays."""
    if TRACE:
        _put(trace_ptr, role, count, phase, _clock(phase), TRACE)


@gluon.jit
def _clock(dep):
    """The SM's cycle counter (``dep``: any scalar, orders the read)."""
    return gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l,r", [dep], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _put(trace_ptr, role, count, phase, value, TRACE: gl.constexpr):
    """``value`` into ``trace [programs, 2, 32, 16]`` at (program, role, item count, phase)."""
    if TRACE:
        gl.store(trace_ptr + ((gl.program_id(0) * 2 + role) * 32 + count) * 16 + phase, value)


@gluon.jit
def _stand_in_minus_a(kk, beta_r, rows, cols, BLOCK: gl.constexpr):
    """The stand-in solve's ``-A = -diag(beta) (K K^T ⊙ M°)`` and its tree, ``same``: chains of ``BLOCK`` nodes (no
    decays; ``QKD = Q K^T ⊙ M`` with ``M = same`` on and below the diagonal)."""
    same = (rows[:, None] // BLOCK) == (cols[None, :] // BLOCK)  # [N, N]
    return gl.where(same & (rows[:, None] > cols[None, :]), -kk * beta_r[:, None], 0.0), same


@gluon.jit
def _unit_lower_inverse(power, rows, cols, cols_smem, rows_smem, a_nn: gl.constexpr, L: gl.constexpr,
                        SMEM_CHAIN: gl.constexpr):
    """``(I + A)^{-1} = prod_{l < L} (I + (-A)^(2^l))`` from ``power = -A``: ``power <- power^2``, ``inv <- inv (I +
    power)``. The B operands pass through ``cols_smem`` (column-major, K-major for ``wgmma``), the A operands by a
    register layout conversion, or with ``SMEM_CHAIN`` through ``rows_smem`` (row-major) as ``inv <- inv + power
    inv`` (the factors commute)."""
    inv = gl.where(rows[:, None] == cols[None, :], 1.0, 0.0) + power  # I + (-A)
    if SMEM_CHAIN:
        if L > 1:
            _barrier()
            rows_smem.store(power)  # A operand: power, row-major
            cols_smem.permute((1, 0)).store(power)  # B operand: power, column-major
            _barrier()
            fence_async_shared()
        for step in gl.static_range(1, L):
            power = warpgroup_mma(rows_smem, cols_smem.permute((1, 0)), power, use_acc=False)
            _barrier()
            rows_smem.store(power)
            cols_smem.permute((1, 0)).store(inv)
            _barrier()
            fence_async_shared()
            inv = warpgroup_mma(rows_smem, cols_smem.permute((1, 0)), inv)
            if step + 1 < L:
                _barrier()
                cols_smem.permute((1, 0)).store(power)
                _barrier()
                fence_async_shared()
    else:
        for _ in gl.static_range(1, L):
            _barrier()
            cols_smem.permute((1, 0)).store(power)  # B operands read power^T's rows: power, K-major
            _barrier()
            fence_async_shared()
            power = warpgroup_mma(gl.convert_layout(power, a_nn), cols_smem.permute((1, 0)), power, use_acc=False)
            _barrier()
            cols_smem.permute((1, 0)).store(power)
            _barrier()
            fence_async_shared()
            inv = warpgroup_mma(gl.convert_layout(inv, a_nn), cols_smem.permute((1, 0)), inv)
    return inv


@gluon.jit
def _loader(pool_desc, q_desc, k_desc, v_desc, tb_desc, qkd_desc, kp_desc, dp_desc, slots_ptr, s_ring, q_ring,
            k_ring, ready, empty, v_smem, tb16, qkd16, kp_smem, dp_smem, ep_ready, ep_empty, path_ready, path_empty,
            n_items, H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, N: gl.constexpr,
            BK: gl.constexpr, STAGES: gl.constexpr, FOLD: gl.constexpr, P: gl.constexpr):
    """Streams every item's chunks into the ring, then its epilogue tiles, as far ahead as the barriers allow."""
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    chunk = 0
    count = 0
    for item in range(pid, n_items, nprog):
        b = item // HV
        hv = item % HV
        h = hv // (HV // H)
        state_row = (gl.load(slots_ptr + b) * HV + hv) * K
        if FOLD >= 2 and FOLD != 26 and FOLD < 28:  # the previous accepted path: its k and Delta rows (commit on)
            mbarrier.wait(path_empty, (count & 1) ^ 1)
            mbarrier.expect(path_ready, kp_desc.block_type.nbytes + dp_desc.block_type.nbytes)
            _tma_load(kp_desc, [b * P, h * K], path_ready, kp_smem)
            _tma_load(dp_desc, [b * P, hv * V], path_ready, dp_smem)
        for k0 in gl.static_range(0, K, BK):
            if (FOLD == 26 or FOLD >= 28) and k0 == STAGES * BK:  # the path tile is freed when the previous item's
                # chunk loop ends, after the slots that this item's first STAGES chunks took: so it is loaded here
                # (earlier would wait on the consumer, later would deadlock: the consumer needs it before its first
                # chunk)
                mbarrier.wait(path_empty, (count & 1) ^ 1)
                mbarrier.expect(path_ready, kp_desc.block_type.nbytes + dp_desc.block_type.nbytes)
                _tma_load(kp_desc, [item * K, 0], path_ready, kp_smem)  # (diag(w) K_p)^T
                _tma_load(dp_desc, [b * P, hv * V], path_ready, dp_smem)
            s = chunk % STAGES
            mbarrier.wait(empty.index(s), ((chunk // STAGES) & 1) ^ 1)  # the first pass finds every slot free
            bar = ready.index(s)
            mbarrier.expect(bar, pool_desc.block_type.nbytes + 2 * q_desc.block_type.nbytes)
            _tma_load(pool_desc, [state_row + k0, 0], bar, s_ring.index(s))
            _tma_load(q_desc, [b * N, h * K + k0], bar, q_ring.index(s))
            _tma_load(k_desc, [b * N, h * K + k0], bar, k_ring.index(s))
            chunk += 1
        mbarrier.wait(ep_empty, (count & 1) ^ 1)
        if FOLD == 3 or FOLD >= 6:  # TB and QKD are solved in the kernel
            mbarrier.expect(ep_ready, v_desc.block_type.nbytes)
            _tma_load(v_desc, [b * N, hv * V], ep_ready, v_smem)
        else:
            mbarrier.expect(ep_ready, v_desc.block_type.nbytes + 2 * tb_desc.block_type.nbytes)
            _tma_load(v_desc, [b * N, hv * V], ep_ready, v_smem)
            _tma_load(tb_desc, [item * N, 0], ep_ready, tb16)
            _tma_load(qkd_desc, [item * N, 0], ep_ready, qkd16)
        count += 1


@gluon.jit
def _consumer(pool_desc, delta_desc, o_desc, slots_ptr, w_ptr, ga_ptr, beta_ptr, s_ring, q_ring, k_ring, ready, empty,
              v_smem, tb16, qkd16, tb32, qkd32, o_smem, kp_smem, dp_smem, kpt_smem, power_smem, ep_ready, ep_empty,
              path_ready, path_empty, tb2, qkd2, tb_ready, tb_empty, o_ptr, gam_ptr, trace_ptr, vec2, scale, n_items,
              pool_ptr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, N: gl.constexpr,
              BK: gl.constexpr, STAGES: gl.constexpr, FOLD: gl.constexpr, WARPS: gl.constexpr, P: gl.constexpr,
              L: gl.constexpr, BLOCK: gl.constexpr, TRACE: gl.constexpr):
    """The products of every item, transposed: rows are the value columns, columns the tree's nodes.
    ``FOLD >= 2``: each state chunk becomes ``gamma_a S + K_p^T diag(w) Delta_p`` before it is used and written back,
    computed as ``S^T <- gamma_a S^T + Delta_p^T (diag(w) K_p)``. ``FOLD == 3``: the solve in line too, from the
    same q / k chunks: ``K K^T``, ``Q K^T``, ``A = diag(beta) (K K^T ⊙ M°)``, ``T = (I + A)^{-1}`` by ``L`` doubling
    steps, ``TB = T diag(beta)``, ``QKD = Q K^T ⊙ M`` (stand-in mask ``M``: chains of ``BLOCK`` nodes, no decays).
    ``FOLD >= 10``: ``Gamma = 2^lg2`` from the prepared ``log2 Gamma`` (``gam_ptr [B HV, N]``), not the solver's.
    ``FOLD == 18``: each chunk's path update is issued beside the previous chunk's products and added in its
    accumulator layout (the A operand reloaded from the rewritten slot instead of converting the update), and a slot
    is released one chunk late (its write-back awaited with one store left in flight instead of none); ``FOLD ==
    19``: the same without the late release. ``FOLD == 20``: ``real-lg-half`` with q / k normalised in the kernel.
    ``FOLD == 21``: ``real-lg-half`` with the item's path weights loaded before the path wait and the next item's
    state row during this item (two global round trips an item off the stream's critical path). ``FOLD == 22``:
    21 with q / k normalised in the kernel, ``|k|^2`` from ``K K^T``'s diagonal (q / k given on the tf32 grid, as
    the short convolution that writes them could round them), ``|q|^2`` from fp32 squares. ``FOLD == 23``: 21
    with 20's norms (fp32 squares of both). ``FOLD == 24``: 23 with the consumer's column factors handed over
    whole (``Gamma rk``, ``scale Gamma rq``: no ``log2 Gamma`` load and no extra multiplies in the consumer).
    ``FOLD == 25``: 21 with the norms summed by a 1-warp partition of their own (``_norm_warp``). ``FOLD == 26``:
    21 with the path's ``(diag(w) K_p)^T`` prepared per item (as the commit's record step could write it) and
    loaded by TMA straight into the tile the updates read, instead of built from the path's k rows per item.
    ``FOLD == 27``: 25 with a 2-warp norm partition; ``28``: 27 with 26's prepared path operand; ``29``: 28 with
    each chunk's products issued from the updated chunk in registers before its write-back (barriers, store,
    fence), so they overlap it. ``30``: 28 with each updated chunk written back from registers by plain stores
    (no staging store, barriers, fence or TMA store; the slot freed once read and fenced); ``31``: 26 with that."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, N, 8])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=1)
    mma16: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                    instr_shape=[16, N, 16])  # FOLD 15: fp16 products
    a16: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma16, k_width=2)
    mma_bk: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                     instr_shape=[16, BK, 8])
    a_bk: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_bk, k_width=1)
    path_rows: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [WARPS, 1], [1, 0])  # [P, K] path k
    mma_nn: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, WARPS // 4],
                                                     instr_shape=[16, N // (WARPS // 4), 8])  # [N, N] products
    a_nn: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_nn, k_width=1)
    wide: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])  # [N, N] fp16 -> fp32 widening
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    chunk = 0
    count = 0
    if FOLD >= 21:  # the first item's state row; each later one is loaded during the previous item
        state_row_next = (gl.load(slots_ptr + pid // HV, mask=pid < n_items, other=0) * HV + pid % HV) * K
    for item in range(pid, n_items, nprog):
        b = item // HV
        hv = item % HV
        if FOLD >= 21:
            state_row = state_row_next
        else:
            state_row = (gl.load(slots_ptr + b) * HV + hv) * K
        _stamp(trace_ptr, 1, count, 0, TRACE)
        ks = gl.zeros([V, N], gl.float32, mma)  # [V, N] (K S0)^T
        qs = gl.zeros([V, N], gl.float32, mma)  # [V, N] (Q S0)^T
        if FOLD == 3:
            kk = gl.zeros([N, N], gl.float32, mma_nn)  # [N, N] K K^T
            qk = gl.zeros([N, N], gl.float32, mma_nn)  # [N, N] Q K^T
        if FOLD >= 2:
            if FOLD >= 21:  # the path's weights loaded before the wait, their latency under it
                if FOLD != 26 and FOLD < 28:
                    w = gl.load(w_ptr + (b * P + gl.arange(0, P, layout=gl.SliceLayout(1, path_rows))) * HV + hv)
                gamma_a = gl.load(ga_ptr + item)
            mbarrier.wait(path_ready, count & 1)
            if FOLD < 21:
                w = gl.load(w_ptr + (b * P + gl.arange(0, P, layout=gl.SliceLayout(1, path_rows))) * HV + hv)  # [P]
            if FOLD != 26 and FOLD < 28:  # (26, 28: the tile arrives built, kpt_smem is the loaded one)
                kpt_smem.permute((1, 0)).store(kp_smem.load(path_rows) * w[:, None])  # [K, P] (diag(w) K_p)^T
            dp_t = dp_smem.permute((1, 0)).load(a_bk)  # [V, P] Delta_p^T
            if FOLD < 21:
                gamma_a = gl.load(ga_ptr + item)
            if FOLD != 26 and FOLD < 28:
                _barrier()
                fence_async_shared()
                mbarrier.arrive(path_empty)
            if FOLD == 18 or FOLD == 19:  # chunk 0's update; each later one beside the previous chunk's products
                upd = warpgroup_mma(dp_t, kpt_smem.slice(0, BK).permute((1, 0)), gl.zeros([V, BK], gl.float32, mma_bk),
                                    use_acc=False)  # [V, BK]
        _stamp(trace_ptr, 1, count, 1, TRACE)
        if TRACE:
            t_wait = _clock(count) * 0  # cycles in the chunk loop: ready waits, path update, products + store
            t_update = t_wait
            t_products = t_wait
        for k0 in gl.static_range(0, K, BK):
            s = chunk % STAGES
            if TRACE:
                t0 = _clock(chunk)
            mbarrier.wait(ready.index(s), (chunk // STAGES) & 1)
            if TRACE:
                t1 = _clock(chunk)
                t_wait += t1 - t0
            if FOLD == 18 or FOLD == 19:  # the update (issued during the previous chunk), in its accumulator layout
                s_new = s_ring.index(s).permute((1, 0)).load(mma_bk) * gamma_a + upd  # [V, BK] S^T updated
                s_ring.index(s).permute((1, 0)).store(s_new)  # (each thread rewrites the elements it read)
                _barrier()
                fence_async_shared()
                s_t = s_ring.index(s).permute((1, 0)).load(a_op)  # [V, BK] the A operand, reloaded
            elif FOLD < 30 or FOLD >= 32:
                s_t = s_ring.index(s).permute((1, 0)).load(a_op)  # [V, BK] S0^T chunk
            if FOLD == 30 or FOLD == 31:  # the update in its accumulator layout, written back from registers
                upd = warpgroup_mma(dp_t, kpt_smem.slice(k0, BK).permute((1, 0)),
                                    gl.zeros([V, BK], gl.float32, mma_bk), use_acc=False)  # [V, BK]
                s_acc = s_ring.index(s).permute((1, 0)).load(mma_bk) * gamma_a + upd  # [V, BK] S^T updated
                s_t = gl.convert_layout(s_acc, a_op)
                ks = warpgroup_mma(s_t, k_ring.index(s).permute((1, 0)), ks, is_async=True)
                qs = warpgroup_mma(s_t, q_ring.index(s).permute((1, 0)), qs, is_async=True)
                v_idx = gl.arange(0, V, layout=gl.SliceLayout(1, mma_bk))  # [V]
                k_idx = gl.arange(0, BK, layout=gl.SliceLayout(0, mma_bk))  # [BK]
                gl.store(pool_ptr + (state_row + k0 + k_idx[None, :]) * V + v_idx[:, None], s_acc)
            elif FOLD >= 2 and not (FOLD == 18 or FOLD == 19):
                upd = warpgroup_mma(dp_t, kpt_smem.slice(k0, BK).permute((1, 0)),
                                    gl.zeros([V, BK], gl.float32, mma_bk), use_acc=False)  # [V, BK]
                s_t = s_t * gamma_a + gl.convert_layout(upd, a_op)
                if FOLD == 29 or FOLD == 34:  # the products from the updated chunk in registers, issued first
                    ks = warpgroup_mma(s_t, k_ring.index(s).permute((1, 0)), ks, is_async=True)
                    qs = warpgroup_mma(s_t, q_ring.index(s).permute((1, 0)), qs, is_async=True)
                if FOLD == 34:  # staged in a tile of its own (tb16's 8 KiB, unused since FOLD 6), whose previous
                    tma.store_wait(0)  # store (issued a chunk ago) is awaited only now
                    _barrier()
                    if _NEW_REINTERPRET:
                        stage = tb16.reinterpret(gl.float32, [BK, V], pool_desc.layout)
                    else:
                        stage = tb16._reinterpret(gl.float32, [BK, V], pool_desc.layout)
                    stage.permute((1, 0)).store(s_t)
                else:
                    _barrier()
                    s_ring.index(s).permute((1, 0)).store(s_t)
                _barrier()
                fence_async_shared()  # (also orders this thread's plain loads of the slot before its refill)
            if TRACE:
                t2 = _clock(chunk)
                t_update += t2 - t1
            if FOLD < 29 or (FOLD >= 32 and FOLD != 34):
                ks = warpgroup_mma(s_t, k_ring.index(s).permute((1, 0)), ks, is_async=True)
                qs = warpgroup_mma(s_t, q_ring.index(s).permute((1, 0)), qs, is_async=True)
            if FOLD == 34:
                _tma_store(pool_desc, [state_row + k0, 0], stage)
            elif FOLD and not (FOLD == 30 or FOLD == 31):  # the state chunk written back in place from its slot
                _tma_store(pool_desc, [state_row + k0, 0], s_ring.index(s))
            if FOLD == 3:
                k_t = k_ring.index(s).permute((1, 0))  # [BK, N] K^T chunk, K-major
                kk = warpgroup_mma(k_ring.index(s), k_t, kk, is_async=True)
                qk = warpgroup_mma(q_ring.index(s), k_t, qk, is_async=True)
                ks, qs, kk, qk = warpgroup_mma_wait(0, deps=(ks, qs, kk, qk))
            elif (FOLD == 18 or FOLD == 19) and k0 + BK < K:  # the next chunk's update beside these products
                upd = warpgroup_mma(dp_t, kpt_smem.slice(k0 + BK, BK).permute((1, 0)),
                                    gl.zeros([V, BK], gl.float32, mma_bk), use_acc=False, is_async=True)
                ks, qs, upd = warpgroup_mma_wait(0, deps=(ks, qs, upd))
            else:
                ks, qs = warpgroup_mma_wait(0, deps=(ks, qs))
            if FOLD == 18:  # a slot is freed one chunk late, once its write-back has read it
                if k0 > 0:
                    tma.store_wait(1)
                    mbarrier.arrive(empty.index((chunk + STAGES - 1) % STAGES))
                if k0 + BK == K:
                    tma.store_wait(0)
                    mbarrier.arrive(empty.index(s))
            else:
                if FOLD == 30 or FOLD == 31:  # the slot was read by plain loads: fenced before the refill's TMA
                    fence_async_shared()
                elif FOLD and FOLD != 34:
                    tma.store_wait(0)
                mbarrier.arrive(empty.index(s))
            if TRACE:
                t_products += _clock(chunk) - t2
            chunk += 1
        _stamp(trace_ptr, 1, count, 2, TRACE)
        if FOLD == 26 or FOLD >= 28:  # the loaded (diag(w) K_p)^T has served its last chunk (Delta_p^T in registers)
            _barrier()
            mbarrier.arrive(path_empty)
        if FOLD >= 21:  # the next item's state row, its latency under this item's epilogue
            nxt = item + nprog
            state_row_next = (gl.load(slots_ptr + nxt // HV, mask=nxt < n_items, other=0) * HV + nxt % HV) * K
        if TRACE:
            _put(trace_ptr, 1, count, 8, t_wait, TRACE)
            _put(trace_ptr, 1, count, 9, t_update, TRACE)
            _put(trace_ptr, 1, count, 10, t_products, TRACE)
        if FOLD >= 10 and FOLD != 24:  # Gamma from the prepared log2 Gamma, loaded before the waits
            gam = gl.exp2(gl.load(gam_ptr + item * N + gl.arange(0, N, layout=gl.SliceLayout(0, mma))))  # [N]
        if FOLD == 13 or FOLD == 14:  # diag(beta) applied to X's columns here (the solver hands over T)
            beta_col = gl.load(beta_ptr + ((b * N + gl.arange(0, N, layout=gl.SliceLayout(0, mma))) * HV + hv))
        if FOLD == 3:
            rows = gl.arange(0, N, layout=gl.SliceLayout(1, mma_nn))  # [N]
            cols = gl.arange(0, N, layout=gl.SliceLayout(0, mma_nn))  # [N]
            beta_r = gl.load(beta_ptr + ((b * N + rows) * HV + hv))  # [N]
            beta_c = gl.load(beta_ptr + ((b * N + cols) * HV + hv))  # [N]
            power, same = _stand_in_minus_a(kk, beta_r, rows, cols, BLOCK)
            inv = _unit_lower_inverse(power, rows, cols, power_smem, power_smem, a_nn, L, False)
            _barrier()
            tb32.store(inv * beta_c[None, :])  # TB = (I + A)^{-1} diag(beta)
            qkd32.store(gl.where(same & (rows[:, None] >= cols[None, :]), qk, 0.0))
            mbarrier.wait(ep_ready, count & 1)
        elif FOLD >= 6:  # TB / QKD from the solver partition, double-buffered
            mbarrier.wait(ep_ready, count & 1)
            mbarrier.wait(tb_ready.index(count % 2), (count // 2) & 1)
        else:
            mbarrier.wait(ep_ready, count & 1)
            tb32.store(tb16.load(wide).to(gl.float32))
            qkd32.store(qkd16.load(wide).to(gl.float32))
        _stamp(trace_ptr, 1, count, 3, TRACE)
        if FOLD >= 8:  # the tree's decays: X = V - Gamma K S0, O = scale Gamma Q S0 + QKD Delta
            if FOLD < 10:
                gam = gl.load(gam_ptr + item * N + gl.arange(0, N, layout=gl.SliceLayout(0, mma)))  # [N] Gamma
            if FOLD == 24:  # the solver's column factors, whole
                x_t = v_smem.permute((1, 0)).load(mma) - ks * vec2.index(2 * (count % 2)).load(
                    gl.SliceLayout(0, mma))[None, :]  # [V, N] (V - Gamma K^ S0)^T
                qs = qs * vec2.index(2 * (count % 2) + 1).load(gl.SliceLayout(0, mma))[None, :]
            elif (FOLD == 12 or FOLD == 14 or FOLD == 20 or FOLD == 22 or FOLD == 23 or FOLD == 25
                  or (FOLD >= 27 and FOLD <= 30) or FOLD >= 32):  # rk, rq
                x_t = v_smem.permute((1, 0)).load(mma) - ks * (gam * vec2.index(2 * (count % 2)).load(
                    gl.SliceLayout(0, mma)))[None, :]  # [V, N] (V - Gamma K^ S0)^T
                qs = qs * (gam * scale * vec2.index(2 * (count % 2) + 1).load(gl.SliceLayout(0, mma)))[None, :]
            else:
                x_t = v_smem.permute((1, 0)).load(mma) - ks * gam[None, :]  # [V, N] (V - Gamma K S0)^T
                qs = qs * (gam * scale)[None, :]
        else:
            x_t = v_smem.permute((1, 0)).load(mma) - ks  # [V, N] (V - K S0)^T
        if FOLD == 13 or FOLD == 14:
            x_t = x_t * beta_col[None, :]  # (X^T diag(beta))
        _barrier()
        fence_async_shared()
        if FOLD >= 15:  # fp16 TB / QKD (fp16 operands, fp32 accumulation: the 11-bit significand of tf32, rounded)
            delta_t = warpgroup_mma(gl.convert_layout(x_t.to(gl.float16), a16), tb2.index(count % 2).permute((1, 0)),
                                    gl.convert_layout(ks, mma16), use_acc=False, is_async=True)
            delta_t = warpgroup_mma_wait(0, deps=(delta_t, ))  # [V, N] Delta^T
            _stamp(trace_ptr, 1, count, 4, TRACE)
            o_t = warpgroup_mma(gl.convert_layout(delta_t.to(gl.float16), a16),
                                qkd2.index(count % 2).permute((1, 0)), gl.convert_layout(qs, mma16), is_async=True)
            delta_t = gl.convert_layout(delta_t, mma)  # (the same registers: only the instruction's K differs)
        elif FOLD >= 6:
            delta_t = warpgroup_mma(gl.convert_layout(x_t, a_op), tb2.index(count % 2).permute((1, 0)), ks,
                                    use_acc=False, is_async=True)
            delta_t = warpgroup_mma_wait(0, deps=(delta_t, ))  # [V, N] Delta^T
            _stamp(trace_ptr, 1, count, 4, TRACE)
            o_t = warpgroup_mma(gl.convert_layout(delta_t, a_op), qkd2.index(count % 2).permute((1, 0)), qs,
                                is_async=True)
        else:
            delta_t = warpgroup_mma(gl.convert_layout(x_t, a_op), tb32.permute((1, 0)), ks, use_acc=False,
                                    is_async=True)
            delta_t = warpgroup_mma_wait(0, deps=(delta_t, ))  # [V, N] Delta^T
            o_t = warpgroup_mma(gl.convert_layout(delta_t, a_op), qkd32.permute((1, 0)), qs, is_async=True)
        if FOLD != 1:  # Delta leaves through v's buffer (v is in registers now)
            _barrier()
            v_smem.permute((1, 0)).store(delta_t)
            _barrier()
            fence_async_shared()
            _tma_store(delta_desc, [b * N, hv * V], v_smem)
        o_t = warpgroup_mma_wait(0, deps=(o_t, ))  # [V, N] O^T
        if FOLD >= 15:
            o_t = gl.convert_layout(o_t, mma)
        _stamp(trace_ptr, 1, count, 5, TRACE)
        if FOLD >= 15:
            mbarrier.arrive(tb_empty.index(count % 2))
        if FOLD >= 6 and FOLD < 15:  # O straight from registers (no staging tile: its smem holds TB / QKD twice)
            mbarrier.arrive(tb_empty.index(count % 2))
            v_rows = gl.arange(0, V, layout=gl.SliceLayout(1, mma))  # [V]
            n_cols = gl.arange(0, N, layout=gl.SliceLayout(0, mma))  # [N]
            gl.store(o_ptr + (((b * N + n_cols[None, :]) * HV + hv) * V + v_rows[:, None]), o_t)
            tma.store_wait(0)  # Delta's store has read v's buffer
        else:
            tma.store_wait(0 if FOLD == 1 else 1)  # the previous item's O store has read o_smem
            _barrier()
            o_smem.permute((1, 0)).store(o_t)
            _barrier()
            fence_async_shared()
            _tma_store(o_desc, [b * N, hv * V], o_smem)
            tma.store_wait(1)  # Delta's store has read v's buffer
        _stamp(trace_ptr, 1, count, 6, TRACE)
        mbarrier.arrive(ep_empty)
        _stamp(trace_ptr, 1, count, 7, TRACE)
        count += 1
    tma.store_wait(0)


@gluon.jit
def _solver(beta_ptr, q_ring, k_ring, ready, empty, solve_smem, n_items, HV: gl.constexpr, K: gl.constexpr,
            N: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr, L: gl.constexpr, BLOCK: gl.constexpr):
    """``FOLD == 4``: the fused stage's solve in a 4-warp partition of its own, beside the ``commit`` stream: it
    reads every item's q / k chunks from the same ring slots (each slot freed by both) and leaves ``TB + QKD`` in
    its own shared tile. The consumer does not wait for it (its epilogue uses the loaded ``TB`` / ``QKD``): this
    measures whether the solve's work can run beside the state stream on the same SMs, not the hand-off."""
    mma_nn: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, N, 8])
    a_nn: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_nn, k_width=1)
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    chunk = 0
    for item in range(pid, n_items, nprog):
        b = item // HV
        hv = item % HV
        kk = gl.zeros([N, N], gl.float32, mma_nn)  # [N, N] K K^T
        qk = gl.zeros([N, N], gl.float32, mma_nn)  # [N, N] Q K^T
        for k0 in gl.static_range(0, K, BK):
            s = chunk % STAGES
            mbarrier.wait(ready.index(s), (chunk // STAGES) & 1)
            k_t = k_ring.index(s).permute((1, 0))  # [BK, N] K^T chunk, K-major
            kk = warpgroup_mma(k_ring.index(s), k_t, kk, is_async=True)
            qk = warpgroup_mma(q_ring.index(s), k_t, qk, is_async=True)
            kk, qk = warpgroup_mma_wait(0, deps=(kk, qk))
            mbarrier.arrive(empty.index(s))
            chunk += 1
        rows = gl.arange(0, N, layout=gl.SliceLayout(1, mma_nn))  # [N]
        cols = gl.arange(0, N, layout=gl.SliceLayout(0, mma_nn))  # [N]
        beta_r = gl.load(beta_ptr + ((b * N + rows) * HV + hv))  # [N]
        beta_c = gl.load(beta_ptr + ((b * N + cols) * HV + hv))  # [N]
        power, same = _stand_in_minus_a(kk, beta_r, rows, cols, BLOCK)
        inv = _unit_lower_inverse(power, rows, cols, solve_smem, solve_smem, a_nn, L, False)
        _barrier()
        solve_smem.store(inv * beta_c[None, :] + gl.where(same & (rows[:, None] >= cols[None, :]), qk, 0.0))


@gluon.jit
def _norm_warp(sq_ring, sk_ring, sready, sfree, nvec, norm_ready, norm_empty, n_items, N: gl.constexpr,
               K: gl.constexpr, BK: gl.constexpr, SLOTS: gl.constexpr, NW: gl.constexpr):
    """``FOLD == 25`` (``NW = 1`` warp), ``27`` / ``28`` (``NW = 2``): a partition that reads every q / k chunk of
    the solve's ring beside it (each slot freed to the solve's refill by ``sfree``), sums fp32 squares and leaves
    ``rsqrt(|k|^2 + 1e-6)``, ``rsqrt(|q|^2 + 1e-6)`` in ``nvec [2 items, 2, N]`` for the solve (``norm_ready`` /
    ``norm_empty``), so the norms leave the solve."""
    rows_l: gl.constexpr = gl.BlockedLayout([1, BK], [32, 1], [NW, 1], [1, 0])  # [N, BK]: whole rows a thread
    CHUNKS: gl.constexpr = K // BK
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    sc = 0
    count = 0
    for item in range(pid, n_items, nprog):
        par = count % 2
        mbarrier.wait(norm_empty.index(par), ((count // 2) & 1) ^ 1)  # the solve has read item count - 2's
        k_sq = gl.zeros([N], gl.float32, gl.SliceLayout(1, rows_l))  # [N] |k_i|^2
        q_sq = gl.zeros([N], gl.float32, gl.SliceLayout(1, rows_l))  # [N] |q_i|^2
        for c in gl.static_range(CHUNKS):
            slot = (sc + c) % SLOTS
            mbarrier.wait(sready.index(slot), ((sc + c) // SLOTS) & 1)
            k_c = sk_ring.index(slot).load(rows_l)  # [N, BK] both loads before the sums
            q_c = sq_ring.index(slot).load(rows_l)  # [N, BK]
            k_sq += gl.sum(k_c * k_c, axis=1)
            q_sq += gl.sum(q_c * q_c, axis=1)
            _barrier()  # every lane's loads done before the one-thread arrive,
            fence_async_shared()  # and ordered before the refill's TMA write (another proxy): without this fence
            mbarrier.arrive(sfree.index(slot))  # the q loads issued last could read the refill (runs 85-87)
        sc += CHUNKS
        nvec.index(2 * par).store(gl.rsqrt(k_sq + 1e-6))
        nvec.index(2 * par + 1).store(gl.rsqrt(q_sq + 1e-6))
        _barrier()
        mbarrier.arrive(norm_ready.index(par))
        count += 1


@gluon.jit
def _norm_global(q_ptr, k_ptr, nvec, norm_ready, norm_empty, n_items, H: gl.constexpr, HV: gl.constexpr,
                 N: gl.constexpr, K: gl.constexpr, BK: gl.constexpr, NW: gl.constexpr):
    """``FOLD == 32``: ``_norm_warp``'s sums from q / k in global memory (``[B, N, H, K]`` contiguous) by plain
    loads, a whole ``BK``-column row piece a thread, instead of from the solve's ring: the partition runs ahead of
    the solve (bounded by ``nvec``'s two buffers) and no ring slot waits for it."""
    rows_l: gl.constexpr = gl.BlockedLayout([1, BK], [32, 1], [NW, 1], [1, 0])  # [N, BK]
    CHUNKS: gl.constexpr = K // BK
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    rows = gl.arange(0, N, layout=gl.SliceLayout(1, rows_l))  # [N]
    cols = gl.arange(0, BK, layout=gl.SliceLayout(0, rows_l))  # [BK]
    count = 0
    for item in range(pid, n_items, nprog):
        par = count % 2
        b = item // HV
        h = (item % HV) // (HV // H)
        base = ((b * N + rows) * (H * K) + h * K)[:, None] + cols[None, :]  # [N, BK] chunk 0's offsets
        mbarrier.wait(norm_empty.index(par), ((count // 2) & 1) ^ 1)  # the solve has read item count - 2's
        k_sq = gl.zeros([N], gl.float32, gl.SliceLayout(1, rows_l))  # [N] |k_i|^2
        q_sq = gl.zeros([N], gl.float32, gl.SliceLayout(1, rows_l))  # [N] |q_i|^2
        for c in gl.static_range(CHUNKS):
            k_c = gl.load(k_ptr + base + c * BK)  # [N, BK]
            q_c = gl.load(q_ptr + base + c * BK)  # [N, BK]
            k_sq += gl.sum(k_c * k_c, axis=1)
            q_sq += gl.sum(q_c * q_c, axis=1)
        nvec.index(2 * par).store(gl.rsqrt(k_sq + 1e-6))
        nvec.index(2 * par + 1).store(gl.rsqrt(q_sq + 1e-6))
        _barrier()
        mbarrier.arrive(norm_ready.index(par))
        count += 1


@gluon.jit
def _solver_ahead(q_desc, k_desc, beta_ptr, sq_ring, sk_ring, sready, solve_smem, rows_smem, tb2, qkd2, tb_ready,
                  tb_empty, words_ptr, g_ptr, gam_ptr, trace_ptr, vec2, scale, n_items, H: gl.constexpr,
                  HV: gl.constexpr, K: gl.constexpr, N: gl.constexpr, BK: gl.constexpr, L: gl.constexpr,
                  BLOCK: gl.constexpr, SMEM_CHAIN: gl.constexpr, REAL: gl.constexpr, W: gl.constexpr,
                  ROW_WORDS: gl.constexpr, LG: gl.constexpr, NORM: gl.constexpr, LEAN: gl.constexpr,
                  SLOTS: gl.constexpr, GNORM: gl.constexpr, FOLDED: gl.constexpr, TRACE: gl.constexpr,
                  sfree=None, nvec=None, norm_ready=None, norm_empty=None, NORMW: gl.constexpr = False,
                  RING_FREE: gl.constexpr = True):
    """``FOLD == 6``: the fused stage's solve in a 4-warp partition that runs ahead of the consumer. It loads each
    item's q / k chunks itself through a 2-slot ring of its own (the next item's first two chunks issued before
    the current item's doubling), and hands ``TB`` / ``QKD`` over in one of two shared tiles, each guarded by a
    ready / empty barrier pair: the consumer's epilogue of item ``j`` waits only for the solve of ``j``, done while
    it streamed earlier items. ``SMEM_CHAIN`` (``FOLD == 7``): every doubling product takes both operands from
    shared memory (``rows_smem`` row-major, ``solve_smem`` column-major) and the update is ``T <- T + P^2 T`` (the
    factors commute), so no operand goes through a register layout conversion. ``REAL`` (``FOLD == 8``): the
    tree's own math instead of the stand-in's: the ancestor mask ``M`` from the bitsets ``words [B, N, W]``,
    ``logGamma = M g``, ``D = M ⊙ exp(logGamma_i - logGamma_j)``, ``A = diag(beta) (K K^T ⊙ D ⊙ M°)``,
    ``QKD = scale Q K^T ⊙ D``, and ``Gamma`` handed to the consumer through ``gam_ptr [B HV, N]`` (global,
    written before the ready barrier's arrive). ``LG`` (``FOLD >= 10``): ``log2 Gamma`` prepared by
    ``_log2_gamma_kernel`` (``gam_ptr [B HV, N]``, read here and by the consumer), so the solve loses the masked row
    sum, its layout conversion and the ``Gamma`` store; ``scale`` rides in the exponent (``d = scale D``, ``QKD = Q
    K^T ⊙ d``, ``-A = (-beta / scale) K K^T ⊙ d ⊙ M°``); the row vectors load before the Gram products, the column
    vectors after them (a column vector costs 16 registers a thread across the loop). ``NORM`` (``FOLD == 12``):
    q and k L2-normalised in the kernel: ``|q_i|^2``, ``|k_i|^2`` summed in fp32 from the ring's chunks, ``rk =
    rsqrt(|k|^2 + 1e-6)``; the column factor ``rk_j`` rides in the exponent (``d = scale D diag(rk)``), the row
    factors multiply (``QKD = diag(rq) Q K^T ⊙ d``, ``-A = diag(-beta rk / scale) K K^T ⊙ d ⊙ M°``), and ``rk``,
    ``rq`` go to the consumer in ``vec2 [4, N]`` beside ``TB``. ``LEAN`` (``FOLD >= 13``): fewer live ``[N, N]``
    tiles (the solve spilled at 184 registers): the mask lives only in ``d`` (0 off the paths), ``QKD`` is stored
    as soon as it is formed (the hand-over slot awaited first), and ``diag(beta)`` moves to the consumer (``TB =
    T``, ``Delta^T = (X^T diag(beta)) T^T``), so no column vector of ``beta`` lives across the doubling.
    ``SLOTS``: the solver's own q / k ring (2; 3 for ``FOLD == 16``; 4 for ``FOLD == 17``, whose doubling converts
    registers instead of keeping both operands in shared memory, to make room)."""
    mma_nn: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, N, 8])
    a_nn: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_nn, k_width=1)
    CHUNKS: gl.constexpr = K // BK
    sq_rows: gl.constexpr = gl.BlockedLayout([1, BK // 2], [16, 2], [4, 1], [1, 0])  # [N, BK] chunk, for |x|^2
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    if pid < n_items:  # the first item's first two chunks
        h0 = (pid % HV) // (HV // H)
        for c in gl.static_range(SLOTS):
            mbarrier.expect(sready.index(c), 2 * q_desc.block_type.nbytes)
            _tma_load(q_desc, [(pid // HV) * N, h0 * K + c * BK], sready.index(c),
                                            sq_ring.index(c))
            _tma_load(k_desc, [(pid // HV) * N, h0 * K + c * BK], sready.index(c),
                                            sk_ring.index(c))
    count = 0
    sc = 0
    for item in range(pid, n_items, nprog):
        b = item // HV
        hv = item % HV
        h = hv // (HV // H)
        nxt = item + nprog
        rows = gl.arange(0, N, layout=gl.SliceLayout(1, mma_nn))  # [N]
        cols = gl.arange(0, N, layout=gl.SliceLayout(0, mma_nn))  # [N]
        _stamp(trace_ptr, 0, count, 0, TRACE)
        if LG:  # row vectors (2 registers a thread each) before the Gram products
            beta_r = gl.load(beta_ptr + ((b * N + rows) * HV + hv))  # [N]
            lg_r = gl.load(gam_ptr + item * N + rows) + gl.log2(scale)  # [N] log2(scale Gamma_i)
            if ROW_WORDS:
                row_word0 = gl.load(words_ptr + ((b * N + rows) * W))  # [N] int32: nodes 0-31
                row_word1 = gl.load(words_ptr + ((b * N + rows) * W + (W - 1)))  # [N] int32: nodes 32-63 (W = 2)
        elif ROW_WORDS:  # the item's vectors loaded before the Gram products, so their latency hides under them
            gl.static_assert(W <= 2, "the probe's row words hold N <= 64")
            row_word0 = gl.load(words_ptr + ((b * N + rows) * W))  # [N] int32: nodes 0-31
            row_word1 = gl.load(words_ptr + ((b * N + rows) * W + (W - 1)))  # [N] int32: nodes 32-63 (W = 2)
            g_c = gl.load(g_ptr + ((b * N + cols) * HV + hv))  # [N]
            beta_r = gl.load(beta_ptr + ((b * N + rows) * HV + hv))  # [N]
            beta_c = gl.load(beta_ptr + ((b * N + cols) * HV + hv))  # [N]
        kk = gl.zeros([N, N], gl.float32, mma_nn)  # [N, N] K K^T
        qk = gl.zeros([N, N], gl.float32, mma_nn)  # [N, N] Q K^T
        if NORM and not NORMW:
            k_sq = gl.zeros([N], gl.float32, gl.SliceLayout(1, sq_rows))  # [N] |k_i|^2
            q_sq = gl.zeros([N], gl.float32, gl.SliceLayout(1, sq_rows))  # [N] |q_i|^2
        for c in gl.static_range(CHUNKS):
            slot = (sc + c) % SLOTS  # the ring runs across items: sc counts the chunks consumed before this item
            mbarrier.wait(sready.index(slot), ((sc + c) // SLOTS) & 1)
            k_t = sk_ring.index(slot).permute((1, 0))  # [BK, N] K^T chunk, K-major
            kk = warpgroup_mma(sk_ring.index(slot), k_t, kk, is_async=True)
            qk = warpgroup_mma(sq_ring.index(slot), k_t, qk, is_async=True)
            if NORM and not NORMW:  # fp32 squares from the same chunks while the products run
                if not GNORM:  # (GNORM: |k|^2 is K K^T's diagonal)
                    k_c = sk_ring.index(slot).load(sq_rows)  # [N, BK]
                    k_sq += gl.sum(k_c * k_c, axis=1)
                q_c = sq_ring.index(slot).load(sq_rows)  # [N, BK]
                q_sq += gl.sum(q_c * q_c, axis=1)
            kk, qk = warpgroup_mma_wait(0, deps=(kk, qk))
            _barrier()
            if NORMW and RING_FREE:  # the norm warp has read the slot too
                mbarrier.wait(sfree.index(slot), ((sc + c) // SLOTS) & 1)
            if c + SLOTS < CHUNKS:  # this item's chunk c + SLOTS into the freed slot
                mbarrier.expect(sready.index(slot), 2 * q_desc.block_type.nbytes)
                _tma_load(q_desc, [b * N, h * K + (c + SLOTS) * BK], sready.index(slot),
                                                sq_ring.index(slot))
                _tma_load(k_desc, [b * N, h * K + (c + SLOTS) * BK], sready.index(slot),
                                                sk_ring.index(slot))
            else:  # the next item's chunk c + SLOTS - CHUNKS, loaded while this item's doubling runs
                if nxt < n_items:
                    h_n = (nxt % HV) // (HV // H)
                    mbarrier.expect(sready.index(slot), 2 * q_desc.block_type.nbytes)
                    _tma_load(q_desc, [(nxt // HV) * N, h_n * K + (c + SLOTS - CHUNKS) * BK],
                                                    sready.index(slot), sq_ring.index(slot))
                    _tma_load(k_desc, [(nxt // HV) * N, h_n * K + (c + SLOTS - CHUNKS) * BK],
                                                    sready.index(slot), sk_ring.index(slot))
        sc += CHUNKS
        _stamp(trace_ptr, 0, count, 1, TRACE)
        if LG:
            if not LEAN:
                beta_c = gl.load(beta_ptr + ((b * N + cols) * HV + hv))  # [N]
            lg_c = gl.load(gam_ptr + item * N + cols)  # [N] log2 Gamma_j
        elif not ROW_WORDS:
            beta_r = gl.load(beta_ptr + ((b * N + rows) * HV + hv))  # [N]
            beta_c = gl.load(beta_ptr + ((b * N + cols) * HV + hv))  # [N]
        if LG:
            if ROW_WORDS:
                word = gl.where(cols[None, :] < 32, row_word0[:, None], row_word1[:, None])  # [N, N] int32
            else:
                word = gl.load(words_ptr + ((b * N + rows[:, None]) * W + cols[None, :] // 32))  # [N, N] int32
            anc = ((word >> (cols[None, :] % 32)) & 1) != 0  # [N, N] M: j ancestor-or-self of i
            row_a = -beta_r / scale  # [N] -A's row factor
            if NORMW:  # the norm warp's factors, loaded in both layouts (no conversion)
                mbarrier.wait(norm_ready.index(count % 2), (count // 2) & 1)
                rk_r = nvec.index(2 * (count % 2)).load(gl.SliceLayout(1, mma_nn))  # [N] rows
                rk_c = nvec.index(2 * (count % 2)).load(gl.SliceLayout(0, mma_nn))  # [N] columns
                rq_r = nvec.index(2 * (count % 2) + 1).load(gl.SliceLayout(1, mma_nn))  # [N] rows
                lg_c = lg_c - gl.log2(rk_c)  # the column factor in the exponent
                row_a = row_a * rk_r
            elif NORM:
                if GNORM:  # K K^T's diagonal: exact for q / k already on the tf32 grid (tf32 x tf32 is exact in fp32)
                    on_diag = rows[:, None] == cols[None, :]  # [N, N]
                    rk_r = gl.rsqrt(gl.sum(gl.where(on_diag, kk, 0.0), axis=1) + 1e-6)  # [N] rows
                    if FOLDED:  # the column copy by a layout conversion (the column sum spilled)
                        rk_c = gl.convert_layout(rk_r, gl.SliceLayout(0, mma_nn))  # [N] columns
                    else:
                        rk_c = gl.rsqrt(gl.sum(gl.where(on_diag, kk, 0.0), axis=0) + 1e-6)  # [N] columns
                else:
                    rk_r = gl.rsqrt(gl.convert_layout(k_sq, gl.SliceLayout(1, mma_nn)) + 1e-6)  # [N] rows
                    rk_c = gl.rsqrt(gl.convert_layout(k_sq, gl.SliceLayout(0, mma_nn)) + 1e-6)  # [N] columns
                rq_r = gl.rsqrt(gl.convert_layout(q_sq, gl.SliceLayout(1, mma_nn)) + 1e-6)  # [N] rows
                if FOLDED:  # the consumer's column factors, parked in private rows of vec2 across the doubling
                    gam_c = gl.exp2(lg_c)  # [N] Gamma_j
                    vec2.index(4).store(gam_c * rk_c)  # Gamma rk
                    vec2.index(5).store(gam_c * scale * gl.convert_layout(rq_r, gl.SliceLayout(0, mma_nn)))
                lg_c = lg_c - gl.log2(rk_c)  # the column factor in the exponent
                row_a = row_a * rk_r
            decay = gl.exp2(gl.where(anc, lg_r[:, None] - lg_c[None, :], float("-inf")))  # [N, N] scale D (diag(rk))
            if LEAN:
                mbarrier.wait(tb_empty.index(count % 2), ((count // 2) & 1) ^ 1)  # item count - 2's slot is free
                if NORM:
                    qkd2.index(count % 2).store((qk * decay * rq_r[:, None]).to(qkd2.dtype))  # diag(rq) scale QK^T ⊙ D
                else:
                    qkd2.index(count % 2).store((qk * decay).to(qkd2.dtype))  # QKD = scale Q K^T ⊙ D
                power = gl.where(rows[:, None] != cols[None, :], kk * decay * row_a[:, None], 0.0)  # -A
            else:
                power = gl.where(anc & (rows[:, None] != cols[None, :]), kk * decay * row_a[:, None], 0.0)  # -A
                qk = qk * decay  # QKD = scale Q K^T ⊙ D (NORM: before diag(rq))
                if NORM:
                    qk = qk * rq_r[:, None]
        elif REAL:
            if ROW_WORDS:  # each row's W words (loaded above), the column's word picked in registers
                word = gl.where(cols[None, :] < 32, row_word0[:, None], row_word1[:, None])  # [N, N] int32
            else:
                word = gl.load(words_ptr + ((b * N + rows[:, None]) * W + cols[None, :] // 32))  # [N, N] int32
                g_c = gl.load(g_ptr + ((b * N + cols) * HV + hv))  # [N]
            anc = ((word >> (cols[None, :] % 32)) & 1) != 0  # [N, N] M: j ancestor-or-self of i
            log_gamma = gl.sum(gl.where(anc, g_c[None, :], 0.0), axis=1)  # [N] rows: M g
            log_gamma_c = gl.convert_layout(log_gamma, gl.SliceLayout(0, mma_nn))  # [N] columns
            decay = gl.exp(gl.where(anc, log_gamma[:, None] - log_gamma_c[None, :], float("-inf")))  # [N, N] D
            power = gl.where(anc & (rows[:, None] != cols[None, :]), -kk * decay * beta_r[:, None], 0.0)  # (-A)
            qk = qk * decay * scale  # QKD
            gl.store(gam_ptr + item * N + rows, gl.exp(log_gamma))
        else:
            power, same = _stand_in_minus_a(kk, beta_r, rows, cols, BLOCK)
            qk = gl.where(same & (rows[:, None] >= cols[None, :]), qk, 0.0)  # QKD
        _stamp(trace_ptr, 0, count, 2, TRACE)
        inv = _unit_lower_inverse(power, rows, cols, solve_smem, rows_smem, a_nn, L, SMEM_CHAIN)
        _stamp(trace_ptr, 0, count, 3, TRACE)
        buf = count % 2
        if not LEAN:
            mbarrier.wait(tb_empty.index(buf), ((count // 2) & 1) ^ 1)  # the consumer is done with item count - 2's
        _stamp(trace_ptr, 0, count, 4, TRACE)
        if LEAN:
            tb2.index(buf).store(inv.to(tb2.dtype))  # T = (I + A)^{-1} (diag(beta) in the consumer)
        else:
            tb2.index(buf).store((inv * beta_c[None, :]).to(tb2.dtype))  # TB = (I + A)^{-1} diag(beta)
            qkd2.index(buf).store(qk.to(qkd2.dtype))
        if FOLDED:  # the consumer's column factors whole: Gamma rk for K S0, scale Gamma rq for Q S0
            vec2.index(2 * buf).store(vec2.index(4).load(gl.SliceLayout(0, mma_nn)))
            vec2.index(2 * buf + 1).store(vec2.index(5).load(gl.SliceLayout(0, mma_nn)))
        elif NORMW:  # reloaded here rather than kept live across the doubling
            vec2.index(2 * buf).store(nvec.index(2 * buf).load(gl.SliceLayout(0, mma_nn)))
            vec2.index(2 * buf + 1).store(nvec.index(2 * buf + 1).load(gl.SliceLayout(0, mma_nn)))
        elif NORM:
            vec2.index(2 * buf).store(rk_c)
            vec2.index(2 * buf + 1).store(gl.convert_layout(rq_r, gl.SliceLayout(0, mma_nn)))
        _barrier()
        fence_async_shared()
        mbarrier.arrive(tb_ready.index(buf))
        if NORMW:
            mbarrier.arrive(norm_empty.index(buf))
        _stamp(trace_ptr, 0, count, 5, TRACE)
        count += 1


@gluon.jit
def _gluon_apply(pool_desc, q_desc, k_desc, v_desc, tb_desc, qkd_desc, delta_desc, o_desc, kp_desc, dp_desc,
                 slots_ptr, w_ptr, ga_ptr, beta_ptr, o_ptr, words_ptr, g_ptr, gam_ptr, trace_ptr, scale, n_items,
                 pool_ptr, q_ptr, k_ptr,
                 H: gl.constexpr, HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, N: gl.constexpr,
                 BK: gl.constexpr, STAGES: gl.constexpr, FOLD: gl.constexpr, WARPS: gl.constexpr, P: gl.constexpr,
                 L: gl.constexpr, BLOCK: gl.constexpr, SOLVER_REGS: gl.constexpr, W: gl.constexpr,
                 TRACE: gl.constexpr):
    """``FOLD``: 0 the split apply's ``full`` stage, 1 ``fold`` (state chunks written back unchanged, no Delta
    stored), 2 ``commit`` (the previous step's path update applied to each chunk before use, written back, Delta
    stored), 3 ``commit`` with the solve in line (``_consumer``)."""
    s_ring = gl.allocate_shared_memory(gl.float32, [STAGES, BK, V], pool_desc.layout)
    q_ring = gl.allocate_shared_memory(gl.float32, [STAGES, N, BK], q_desc.layout)
    k_ring = gl.allocate_shared_memory(gl.float32, [STAGES, N, BK], k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.float32, [N, V], v_desc.layout)
    o_smem = gl.allocate_shared_memory(gl.float32, [N, V], o_desc.layout)
    tb16 = gl.allocate_shared_memory(gl.float16, [N, N], tb_desc.layout)
    qkd16 = gl.allocate_shared_memory(gl.float16, [N, N], qkd_desc.layout)
    wide_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)
    tb32 = gl.allocate_shared_memory(gl.float32, [N, N], wide_layout)
    qkd32 = gl.allocate_shared_memory(gl.float32, [N, N], wide_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ep_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ep_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    if FOLD == 26 or FOLD >= 28:  # the path tile arrives as (diag(w) K_p)^T: one tile serves as both
        kp_smem = gl.allocate_shared_memory(gl.float32, [K, P], kp_desc.layout)
    else:
        kp_smem = gl.allocate_shared_memory(gl.float32, [P, K], kp_desc.layout)
    dp_smem = gl.allocate_shared_memory(gl.float32, [P, V], dp_desc.layout)
    kpt_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=32, rank=2)
    if FOLD == 26 or FOLD >= 28:
        kpt_smem = kp_smem
    else:
        kpt_smem = gl.allocate_shared_memory(gl.float32, [K, P], kpt_layout)
    path_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    path_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    power_smem = gl.allocate_shared_memory(gl.float32, [N, N], wide_layout)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2 if FOLD == 4 else 1)  # FOLD 4: freed by the consumer and the solver
    mbarrier.init(ep_ready, count=1)
    mbarrier.init(ep_empty, count=1)
    mbarrier.init(path_ready, count=1)
    mbarrier.init(path_empty, count=1)
    fence_async_shared()
    # (constexpr arguments must be written in the call: a tuple variable would turn them into tensors)
    SOLVER_SLOTS: gl.constexpr = 3 if FOLD == 16 else (4 if FOLD == 17 else 2)  # the solver's q / k ring
    if FOLD >= 15:  # fp16 hand-off, and O leaves through a staging tile by TMA
        half_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        tb2 = gl.allocate_shared_memory(gl.float16, [2, N, N], half_layout)
        qkd2 = gl.allocate_shared_memory(gl.float16, [2, N, N], half_layout)
    else:
        tb2 = gl.allocate_shared_memory(gl.float32, [2, N, N], wide_layout)  # FOLD 6: the solver's hand-off
        qkd2 = gl.allocate_shared_memory(gl.float32, [2, N, N], wide_layout)
    tb_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    tb_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    sready = gl.allocate_shared_memory(gl.int64, [SOLVER_SLOTS, 1], mbarrier.MBarrierLayout())
    vec2 = gl.allocate_shared_memory(gl.float32, [6, N], gl.SwizzledSharedLayout(1, 1, 1, [0]))  # FOLD 12, 24
    for i in gl.static_range(2):
        mbarrier.init(tb_ready.index(i), count=1)
        mbarrier.init(tb_empty.index(i), count=1)
    for i in gl.static_range(SOLVER_SLOTS):
        mbarrier.init(sready.index(i), count=1)
    fence_async_shared()
    sfree = gl.allocate_shared_memory(gl.int64, [SOLVER_SLOTS, 1], mbarrier.MBarrierLayout())  # FOLD 25
    norm_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    norm_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    nvec = gl.allocate_shared_memory(gl.float32, [4, N], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    for i in gl.static_range(SOLVER_SLOTS):
        mbarrier.init(sfree.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(norm_ready.index(i), count=1)
        mbarrier.init(norm_empty.index(i), count=1)
    fence_async_shared()
    if FOLD == 25 or (FOLD >= 27 and FOLD <= 30) or FOLD >= 33:
        solve_smem = gl.allocate_shared_memory(gl.float32, [N, N], wide_layout)
        rows_smem = gl.allocate_shared_memory(gl.float32, [N, N], wide_layout)
        sq_ring = gl.allocate_shared_memory(gl.float32, [SOLVER_SLOTS, N, BK], q_desc.layout)
        sk_ring = gl.allocate_shared_memory(gl.float32, [SOLVER_SLOTS, N, BK], k_desc.layout)
        gl.warp_specialize([
            (_consumer, (pool_desc, delta_desc, o_desc, slots_ptr, w_ptr, ga_ptr, beta_ptr, s_ring, q_ring, k_ring,
                         ready, empty, v_smem, tb16, qkd16, tb32, qkd32, o_smem, kp_smem, dp_smem, kpt_smem,
                         power_smem, ep_ready, ep_empty, path_ready, path_empty, tb2, qkd2, tb_ready, tb_empty,
                         o_ptr, gam_ptr, trace_ptr, vec2, scale, n_items, pool_ptr, HV, K, V, N, BK, STAGES, FOLD,
                         WARPS, P, L, BLOCK, TRACE)),
            (_loader, (pool_desc, q_desc, k_desc, v_desc, tb_desc, qkd_desc, kp_desc, dp_desc, slots_ptr, s_ring,
                       q_ring, k_ring, ready, empty, v_smem, tb16, qkd16, kp_smem, dp_smem, ep_ready, ep_empty,
                       path_ready, path_empty, n_items, H, HV, K, V, N, BK, STAGES, FOLD, P)),
            (_solver_ahead, (q_desc, k_desc, beta_ptr, sq_ring, sk_ring, sready, solve_smem, rows_smem, tb2, qkd2,
                             tb_ready, tb_empty, words_ptr, g_ptr, gam_ptr, trace_ptr, vec2, scale, n_items, H, HV,
                             K, N, BK, L, BLOCK, True, True, W, False, True, True, False, SOLVER_SLOTS, False, False,
                             TRACE, sfree, nvec, norm_ready, norm_empty, True)),
            (_norm_warp, (sq_ring, sk_ring, sready, sfree, nvec, norm_ready, norm_empty, n_items, N, K, BK,
                          SOLVER_SLOTS, 1 if FOLD == 25 else 2)),
        ], [1, 4, 1 if FOLD == 25 else 2], [40 if FOLD != 33 else 32, SOLVER_REGS, 48 if FOLD != 33 else 40])
    elif FOLD == 32:
        solve_smem = gl.allocate_shared_memory(gl.float32, [N, N], wide_layout)
        rows_smem = gl.allocate_shared_memory(gl.float32, [N, N], wide_layout)
        sq_ring = gl.allocate_shared_memory(gl.float32, [SOLVER_SLOTS, N, BK], q_desc.layout)
        sk_ring = gl.allocate_shared_memory(gl.float32, [SOLVER_SLOTS, N, BK], k_desc.layout)
        gl.warp_specialize([
            (_consumer, (pool_desc, delta_desc, o_desc, slots_ptr, w_ptr, ga_ptr, beta_ptr, s_ring, q_ring, k_ring,
                         ready, empty, v_smem, tb16, qkd16, tb32, qkd32, o_smem, kp_smem, dp_smem, kpt_smem,
                         power_smem, ep_ready, ep_empty, path_ready, path_empty, tb2, qkd2, tb_ready, tb_empty,
                         o_ptr, gam_ptr, trace_ptr, vec2, scale, n_items, pool_ptr, HV, K, V, N, BK, STAGES, FOLD,
                         WARPS, P, L, BLOCK, TRACE)),
            (_loader, (pool_desc, q_desc, k_desc, v_desc, tb_desc, qkd_desc, kp_desc, dp_desc, slots_ptr, s_ring,
                       q_ring, k_ring, ready, empty, v_smem, tb16, qkd16, kp_smem, dp_smem, ep_ready, ep_empty,
                       path_ready, path_empty, n_items, H, HV, K, V, N, BK, STAGES, FOLD, P)),
            (_solver_ahead, (q_desc, k_desc, beta_ptr, sq_ring, sk_ring, sready, solve_smem, rows_smem, tb2, qkd2,
                             tb_ready, tb_empty, words_ptr, g_ptr, gam_ptr, trace_ptr, vec2, scale, n_items, H, HV,
                             K, N, BK, L, BLOCK, True, True, W, False, True, True, False, SOLVER_SLOTS, False, False,
                             TRACE, sfree, nvec, norm_ready, norm_empty, True, False)),
            (_norm_global, (q_ptr, k_ptr, nvec, norm_ready, norm_empty, n_items, H, HV, N, K, BK, 2)),
        ], [1, 4, 2], [40, SOLVER_REGS, 48])
    elif FOLD >= 6:
        solve_smem = gl.allocate_shared_memory(gl.float32, [N, N], wide_layout)
        rows_smem = gl.allocate_shared_memory(gl.float32, [N, N], wide_layout)
        sq_ring = gl.allocate_shared_memory(gl.float32, [SOLVER_SLOTS, N, BK], q_desc.layout)
        sk_ring = gl.allocate_shared_memory(gl.float32, [SOLVER_SLOTS, N, BK], k_desc.layout)
        gl.warp_specialize([
            (_consumer, (pool_desc, delta_desc, o_desc, slots_ptr, w_ptr, ga_ptr, beta_ptr, s_ring, q_ring, k_ring,
                         ready, empty, v_smem, tb16, qkd16, tb32, qkd32, o_smem, kp_smem, dp_smem, kpt_smem,
                         power_smem, ep_ready, ep_empty, path_ready, path_empty, tb2, qkd2, tb_ready, tb_empty,
                         o_ptr, gam_ptr, trace_ptr, vec2, scale, n_items, pool_ptr, HV, K, V, N, BK, STAGES, FOLD,
                         WARPS, P, L, BLOCK, TRACE)),
            (_loader, (pool_desc, q_desc, k_desc, v_desc, tb_desc, qkd_desc, kp_desc, dp_desc, slots_ptr, s_ring,
                       q_ring, k_ring, ready, empty, v_smem, tb16, qkd16, kp_smem, dp_smem, ep_ready, ep_empty,
                       path_ready, path_empty, n_items, H, HV, K, V, N, BK, STAGES, FOLD, P)),
            (_solver_ahead, (q_desc, k_desc, beta_ptr, sq_ring, sk_ring, sready, solve_smem, rows_smem, tb2, qkd2,
                             tb_ready, tb_empty, words_ptr, g_ptr, gam_ptr, trace_ptr, vec2, scale, n_items, H, HV,
                             K, N, BK, L, BLOCK, FOLD >= 7 and FOLD != 17, FOLD >= 8, W, FOLD == 9 or FOLD == 11,
                             FOLD >= 10, FOLD == 12 or FOLD == 14 or (FOLD >= 20 and FOLD <= 24 and FOLD != 21),
                             FOLD == 13 or FOLD == 14,
                             SOLVER_SLOTS, FOLD == 22, FOLD == 24,
                             TRACE)),
        ], [1, 4], [40, SOLVER_REGS])
    elif FOLD == 4:
        solve_smem = gl.allocate_shared_memory(gl.float32, [N, N], wide_layout)
        gl.warp_specialize([
            (_consumer, (pool_desc, delta_desc, o_desc, slots_ptr, w_ptr, ga_ptr, beta_ptr, s_ring, q_ring, k_ring,
                         ready, empty, v_smem, tb16, qkd16, tb32, qkd32, o_smem, kp_smem, dp_smem, kpt_smem,
                         power_smem, ep_ready, ep_empty, path_ready, path_empty, tb2, qkd2, tb_ready, tb_empty,
                         o_ptr, gam_ptr, trace_ptr, vec2, scale, n_items, pool_ptr, HV, K, V, N, BK, STAGES, FOLD,
                         WARPS, P, L, BLOCK, TRACE)),
            (_loader, (pool_desc, q_desc, k_desc, v_desc, tb_desc, qkd_desc, kp_desc, dp_desc, slots_ptr, s_ring,
                       q_ring, k_ring, ready, empty, v_smem, tb16, qkd16, kp_smem, dp_smem, ep_ready, ep_empty,
                       path_ready, path_empty, n_items, H, HV, K, V, N, BK, STAGES, FOLD, P)),
            (_solver, (beta_ptr, q_ring, k_ring, ready, empty, solve_smem, n_items, HV, K, N, BK, STAGES, L, BLOCK)),
        ], [1, 4], [40, SOLVER_REGS])
    else:
        gl.warp_specialize([
            (_consumer, (pool_desc, delta_desc, o_desc, slots_ptr, w_ptr, ga_ptr, beta_ptr, s_ring, q_ring, k_ring,
                         ready, empty, v_smem, tb16, qkd16, tb32, qkd32, o_smem, kp_smem, dp_smem, kpt_smem,
                         power_smem, ep_ready, ep_empty, path_ready, path_empty, tb2, qkd2, tb_ready, tb_empty,
                         o_ptr, gam_ptr, trace_ptr, vec2, scale, n_items, pool_ptr, HV, K, V, N, BK, STAGES, FOLD,
                         WARPS, P, L, BLOCK, TRACE)),
            (_loader, (pool_desc, q_desc, k_desc, v_desc, tb_desc, qkd_desc, kp_desc, dp_desc, slots_ptr, s_ring,
                       q_ring, k_ring, ready, empty, v_smem, tb16, qkd16, kp_smem, dp_smem, ep_ready, ep_empty,
                       path_ready, path_empty, n_items, H, HV, K, V, N, BK, STAGES, FOLD, P)),
        ], [1], [40])


@triton.jit
def _log2_gamma_kernel(words_ptr, g_ptr, lg_ptr, N: tl.constexpr, HV: tl.constexpr, W: tl.constexpr):
    """``FOLD >= 10``'s preparation, one program per request: ``log2 Gamma = log2(e) M g`` for every value head,
    ``M [N, N]`` from the bitsets ``words [B, N, W]``, ``g [B, N, HV]``, into ``lg [B, HV, N]`` (an fp32 product
    of 0 / 1 and g, exact up to the summation order)."""
    b = tl.program_id(0)
    nodes = tl.arange(0, N)  # [N]
    heads = tl.arange(0, HV)  # [HV]
    word = tl.load(words_ptr + (b * N + nodes[:, None]) * W + nodes[None, :] // 32)  # [N, N] int32
    anc = ((word >> (nodes[None, :] % 32)) & 1).to(tl.float32)  # [N, N] M
    g = tl.load(g_ptr + (b * N + nodes[:, None]) * HV + heads[None, :])  # [N, HV]
    lg = tl.dot(anc, g, input_precision="ieee")  # [N, HV] log Gamma
    tl.store(lg_ptr + (b * HV + heads[None, :]) * N + nodes[:, None], lg * 1.4426950408889634)


def _layout(block, dtype):
    return gl.NVMMASharedLayout.get_default_for(block, dtype)


def make_path(x, path_nodes: int = PATH):
    """The previous step's accepted path as ``apply_probe._stage`` draws it (same generator and order): k
    ``[B, P, H, K]`` (unit rows), Delta ``[B, P, HV, V]``, decay ratios ``w [B, P, HV]``, ``gamma_a [B HV]``."""
    B = x["q"].shape[0]
    dev = x["v"].device
    gen = torch.Generator(device=dev).manual_seed(2)
    kp = torch.randn(B, path_nodes, H, K, device=dev, generator=gen)  # [B, P, H, K]
    kp = kp / kp.norm(dim=-1, keepdim=True)
    dp = torch.randn(B, path_nodes, HV, V, device=dev, generator=gen) * 0.1  # [B, P, HV, V]
    w = torch.rand(B, path_nodes, HV, device=dev, generator=gen)  # [B, P, HV]
    ga = torch.rand(B * HV, device=dev, generator=gen) * 0.5 + 0.5  # [B HV]
    return kp, dp, w, ga


def descriptors(x, tb, qkd, o, delta, path, bk: int):
    """Gluon TMA descriptors over 2-D views: the pool ``[P HV K, V]``, q / k ``[B N, H K]``, v / o / Delta
    ``[B N, HV V]``, the fp16 scratch ``[B HV N, N]``, the path's k ``[B P, H K]`` and Delta ``[B P, HV V]``."""
    B, N = x["q"].shape[:2]
    kp, dp = path[:2]
    nodes = kp.shape[1]
    pool2 = x["pool"].view(-1, V)  # [P HV K, V]
    q2, k2 = x["q"].view(B * N, H * K), x["k"].view(B * N, H * K)  # [B N, H K]
    v2, o2, d2 = (t.view(B * N, HV * V) for t in (x["v"], o, delta))  # [B N, HV V]
    f32, f16 = gl.float32, gl.float16
    return (TensorDescriptor.from_tensor(pool2, [bk, V], _layout([bk, V], f32)),
            TensorDescriptor.from_tensor(q2, [N, bk], _layout([N, bk], f32)),
            TensorDescriptor.from_tensor(k2, [N, bk], _layout([N, bk], f32)),
            TensorDescriptor.from_tensor(v2, [N, V], _layout([N, V], f32)),
            TensorDescriptor.from_tensor(tb, [N, N], _layout([N, N], f16)),
            TensorDescriptor.from_tensor(qkd, [N, N], _layout([N, N], f16)),
            TensorDescriptor.from_tensor(d2, [N, V], _layout([N, V], f32)),
            TensorDescriptor.from_tensor(o2, [N, V], _layout([N, V], f32)),
            (TensorDescriptor.from_tensor(kp.view(B * nodes, H * K), [nodes, K], _layout([nodes, K], f32))
             if len(path) < 5 else TensorDescriptor.from_tensor(path[4], [K, nodes], gl.NVMMASharedLayout(64, 32, 2))),
            TensorDescriptor.from_tensor(dp.view(B * nodes, HV * V), [nodes, V], _layout([nodes, V], f32)))


def prepared_kpt(path):
    """``FOLD == 26``'s path operand: ``(diag(w) K_p)^T`` per (request, value head), ``[B HV K, P]``."""
    kp, _, w, _ = path[:4]
    B, nodes = kp.shape[:2]
    kp_v = kp.repeat_interleave(HV // H, dim=2)  # [B, P, HV, K]
    return (kp_v * w[..., None]).permute(0, 2, 3, 1).reshape(B * HV * K, nodes).contiguous()  # [B HV K, P]


def launcher(x, tb, qkd, o, delta, path, variant, grid: int, trace=None):
    """A no-argument launch of one (BK, STAGES, FOLD, WARPS) variant over ``grid`` persistent programs (``FOLD >=
    10``: after ``_log2_gamma_kernel``); ``trace [grid, 2, 32, 16]`` int64: the traced build (``_stamp``)."""
    bk, stages, fold, warps = variant[:4]
    B, N = x["q"].shape[:2]
    words = x["meta"].words if "meta" in x else torch.zeros(B, N, 1, dtype=torch.int32, device=o.device)  # [B, N, W]
    gam = torch.empty(B * HV, N, device=o.device)  # [B HV, N] FOLD 8: Gamma from the solver; 10: log2 Gamma
    g = x["g"].contiguous()  # [B, N, HV]
    args = (*descriptors(x, tb, qkd, o, delta, path, bk), x["slots"], path[2], path[3], x["beta"].contiguous(), o,
            words, g, gam, gam if trace is None else trace, K**-0.5, B * HV, x["pool"], x["q"], x["k"], H, HV, K, V, N,
            bk, stages,
            fold, warps,
            path[0].shape[1], variant[5] if len(variant) > 5 else DOUBLINGS, BLOCK,
            variant[4] if len(variant) > 4 else SOLVER_REGS, words.shape[2], trace is not None)
    if fold < 10:
        return lambda: _gluon_apply[(grid, )](*args, num_warps=warps)

    def prepared():
        _log2_gamma_kernel[(B, )](words, g, gam, N, HV, words.shape[2], num_warps=4)
        _gluon_apply[(grid, )](*args, num_warps=warps)
    return prepared


def compile_only(variant):
    """Builds the kernel for sm_90 without a GPU: cuobjdump's resource use and PTX instruction counts."""
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.experimental.gluon._runtime import GluonASTSource  # noqa: PLC0415
    from triton.runtime.jit import mangle_type  # noqa: PLC0415
    bk, stages, fold, warps = variant[:4]
    B, N, pool_slots = 2, 64, 2
    x = dict(pool=torch.zeros(pool_slots, HV, K, V), q=torch.zeros(B, N, H, K), k=torch.zeros(B, N, H, K),
             v=torch.zeros(B, N, HV, V))
    tb = torch.zeros(B * HV * N, N, dtype=torch.float16)
    nodes = variant[6] if len(variant) > 6 else PATH
    path = (torch.zeros(B, nodes, H, K), torch.zeros(B, nodes, HV, V))
    if fold == 26 or fold >= 28:
        path = (*path, None, None, torch.zeros(B * HV * K, nodes))
    descs = descriptors(x, tb, tb, torch.zeros_like(x["v"]), torch.zeros_like(x["v"]), path, bk)
    names = ["pool_desc", "q_desc", "k_desc", "v_desc", "tb_desc", "qkd_desc", "delta_desc", "o_desc", "kp_desc",
             "dp_desc"]
    signature = {n: mangle_type(d) for n, d in zip(names, descs)}
    signature.update(slots_ptr="*i32", w_ptr="*fp32", ga_ptr="*fp32", beta_ptr="*fp32", o_ptr="*fp32",
                     words_ptr="*i32", g_ptr="*fp32", gam_ptr="*fp32", trace_ptr="*i64", scale="fp32", n_items="i32",
                     pool_ptr="*fp32", q_ptr="*fp32", k_ptr="*fp32")
    constexprs = dict(H=H, HV=HV, K=K, V=V, N=N, BK=bk, STAGES=stages, FOLD=fold, WARPS=warps, P=nodes,
                      L=variant[5] if len(variant) > 5 else DOUBLINGS, BLOCK=BLOCK,
                      SOLVER_REGS=variant[4] if len(variant) > 4 else SOLVER_REGS, W=(N + 31) // 32,
                      TRACE=bool(variant[7]) if len(variant) > 7 else False)
    signature.update({n: "constexpr" for n in constexprs})
    kernel = triton.compile(GluonASTSource(_gluon_apply, signature, constexprs), target=GPUTarget("cuda", 90, 64),
                            options=dict(num_warps=warps))
    import re  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import tempfile  # noqa: PLC0415
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        text = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True).stdout
    usage = {k: int(v) for k, v in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", text)}
    ptx = kernel.asm["ptx"]
    return dict(usage, dyn_shared=kernel.metadata.shared, wgmma=ptx.count("wgmma.mma_async"),
                setmaxnreg=ptx.count("setmaxnreg"), tma=ptx.count("cp.async.bulk.tensor"))


STAGE_NAMES = ("full", "fold", "commit", "fused", "overlap", "-", "ahead", "ahead-smem", "real", "real-rows", "real-lg",
               "real-lg-rows", "real-norm", "real-lean", "real-lean-norm",
               "real-lg-half", "real-lg-half-3", "real-lg-half-4",
               "real-lg-half-pipe", "real-lg-half-ahead",
               "real-lg-half-norm", "real-lg-half-prefetch", "real-lg-half-gnorm",
               "real-lg-half-prefetch-norm", "real-lg-half-prefetch-fnorm",
               "real-lg-half-prefetch-wnorm", "real-lg-half-prefetch-kpt",
               "real-lg-half-prefetch-wnorm2", "real-lg-half-prefetch-kpt-wnorm2",
               "real-lg-half-prefetch-kpt-wnorm2-early", "real-lg-half-prefetch-kpt-wnorm2-gwb",
               "real-lg-half-prefetch-kpt-gwb", "real-lg-half-prefetch-kpt-gnorm2",
               "real-lg-half-prefetch-kpt-wnorm2-regs",
               "real-lg-half-prefetch-kpt-wnorm2-stage")
# (BK, STAGES, FOLD, WARPS[, SOLVER_REGS[, L[, P]]]): L = 1 leaves the overlap's solver its Gram products only
# (its doubling steps off: the variant's solver output is then not the inverse, and it is never checked); P: the
# previous accepted path's padded length (PATH unless given)
VARIANTS = [(16, 3, 6, 8, 184), (16, 3, 6, 8, 176), (16, 3, 6, 8, 192), (16, 3, 6, 8, 184, 4, 32),
            (16, 3, 6, 8, 184, 5), (16, 3, 6, 8, 184, 6), (16, 3, 7, 8, 184), (16, 3, 7, 8, 176), (16, 3, 6, 8, 184),
            (16, 3, 2, 8, 152, 4, 32), (16, 3, 2, 8), (32, 2, 2, 8), (32, 3, 0, 8), (16, 3, 6, 8, 184)]


def fused_scratch(x, block: int = BLOCK):
    """float64 ``TB``, ``QKD`` of the fused stage's stand-in solve: ``[B HV N, N]`` each (see ``_consumer``)."""
    B, N, HV_ = x["v"].shape[:3]
    rep = HV_ // x["q"].shape[2]
    k64 = x["k"].double().repeat_interleave(rep, dim=2)  # [B, N, HV, K]
    q64 = x["q"].double().repeat_interleave(rep, dim=2)
    kk = torch.einsum("bihk,bjhk->bhij", k64, k64)  # [B, HV, N, N]
    qk = torch.einsum("bihk,bjhk->bhij", q64, k64)
    i = torch.arange(N, device=x["v"].device)
    same = (i[:, None] // block) == (i[None, :] // block)  # [N, N]
    beta = x["beta"].double().permute(0, 2, 1)  # [B, HV, N]
    a = torch.where(same & (i[:, None] > i[None, :]), kk * beta[..., :, None], 0.0)
    t = torch.linalg.inv(torch.eye(N, dtype=torch.float64, device=a.device) + a)
    tb = t * beta[..., None, :]
    qkd = torch.where(same & (i[:, None] >= i[None, :]), qk, 0.0)
    return tb.reshape(B * HV_ * N, N), qkd.reshape(B * HV_ * N, N)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gluon_probe.json")
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="one launch of each stage, checked, untimed")
    parser.add_argument("--trace", action="store_true",
                        help="after each timed variant (FOLD >= 6), one traced launch: mean cycles of each phase")
    parser.add_argument("--rows", action="store_true", help="per-row report of o's misses (which rows, what scale)")
    parser.add_argument("--variants", help="';'-separated variant tuples instead of VARIANTS, e.g. '16,3,7,8,184,5'")
    args = parser.parse_args()
    variants = [tuple(int(v) for v in item.split(",")) for item in args.variants.split(";")] if args.variants \
        else VARIANTS
    if args.compile_only:
        for variant in variants:
            try:
                print(variant, compile_only(variant))
            except Exception as exc:  # noqa: BLE001
                print(variant, f"{type(exc).__name__}: {str(exc)[:3000]}")
        return 0
    return run(args, variants[:1] if args.smoke else variants, timed=not args.smoke)


SOLVER_PHASES = ("gram", "math", "doubling", "waits-consumer", "hand-over", "to-next-item")
CONSUMER_PHASES = ("path-wait", "chunks", "waits-solver+v", "x+delta-mma", "o-mma", "stores", "arrive",
                   "to-next-item")
CONSUMER_SUMS = ("chunk-ready-waits", "chunk-path-updates", "chunk-products+store")  # phases 8-10: sums


def trace_summary(trace, n_items: int):
    """Mean cycles of each phase per item from ``trace [grid, 2, 32, 16]`` (``_stamp``), the first item of every
    program left out (its start-up), the mean item period of each partition, and the consumer's chunk-loop sums."""
    grid = trace.shape[0]
    counts = [len(range(p, n_items, grid)) for p in range(grid)]
    out = {}
    for role, phases, names in ((0, 6, SOLVER_PHASES), (1, 8, CONSUMER_PHASES)):
        per = {n: [] for n in names}
        period = []
        for p in range(grid):
            t = trace[p, role, :counts[p], :phases].double()  # [items, phases]
            for c in range(1, counts[p]):
                for i, n in enumerate(names[:phases - 1]):
                    per[n].append(float(t[c, i + 1] - t[c, i]))
                if c + 1 < counts[p]:
                    per[names[-1]].append(float(t[c + 1, 0] - t[c, phases - 1]))
                    period.append(float(t[c + 1, 0] - t[c, 0]))
        out["solver" if role == 0 else "consumer"] = dict({n: sum(v) / max(len(v), 1) for n, v in per.items()},
                                                          period=sum(period) / max(len(period), 1))
    sums = [trace[p, 1, 1:counts[p], 8:11].double() for p in range(grid)]  # [items, 3] each
    out["consumer"].update(zip(CONSUMER_SUMS, torch.cat(sums).mean(0).tolist()))
    return out


def _tf32(x):
    """fp32 ``x`` on the tf32 grid by the library's rule (``gdn_tree._tf32_round``: half an ulp of tf32 added to
    the magnitude, the low 13 bits cleared), so the probe's inputs are what the library's rounding would give."""
    return ((x.contiguous().view(torch.int32) + 0x1000) & -8192).view(torch.float32)


def row_report(label: str, o: torch.Tensor, want_o: torch.Tensor) -> None:
    """Prints which rows ``(b, n, hv)`` of ``o [B, N, HV, V]`` miss the float64 ``want_o`` by more than 1e-2: their
    count, items, best-fit scale onto ``want_o`` (a wrong norm scales a row) and the residual after that scale."""
    got = o.double()  # [B, N, HV, V]
    err = (got - want_o).norm(dim=-1) / want_o.norm(dim=-1)  # [B, N, HV]
    fit = (got * want_o).sum(-1) / (want_o * want_o).sum(-1)  # [B, N, HV]
    resid = (got - fit[..., None] * want_o).norm(dim=-1) / want_o.norm(dim=-1)  # [B, N, HV]
    bad = (err > 1e-2).nonzero().tolist()
    items = sorted({(b, hv) for b, _, hv in bad})
    print(f"rows {label}: {len(bad)} of {err.numel()} rows off by > 1e-2 in {len(items)} items {items[:12]}; "
          f"max row error {float(err.max()):.2e}; " + "; ".join(
              f"(b {b}, n {n}, hv {hv}) err {float(err[b, n, hv]):.2e} scale {float(fit[b, n, hv]):.4f} "
              f"resid {float(resid[b, n, hv]):.2e}" for b, n, hv in bad[:10]), flush=True)


def check(x, tb, qkd, path, variant, grid: int, ladder, time_fn=None, traced: bool = False, rows: bool = False):
    """One variant on NaN-poisoned outputs (``commit``: on a copy of the pool) against float64: (errors of o,
    Delta and, for ``commit``, the committed state; median µs or None)."""
    stage = STAGE_NAMES[variant[2]]
    if variant[2] == 26 or variant[2] >= 28:
        path = (*path[:4], prepared_kpt(path))
    commits = stage in ("commit", "fused", "overlap", "ahead", "ahead-smem") or stage.startswith("real")
    solved = stage in ("fused", "ahead", "ahead-smem") or stage.startswith("real")  # TB / QKD: the kernel's solve
    if commits:
        x = dict(x, pool=x["pool"].clone())
    if solved:  # unit q / k rows keep the stand-in solve's inverse small (real-norm: normalised in the kernel)
        x = dict(x, q=x["q"] / x["q"].norm(dim=-1, keepdim=True), k=x["k"] / x["k"].norm(dim=-1, keepdim=True))
    if "norm" in stage:  # what the kernel is given: rows of random norms (q in [1, 4], k in [0.25, 1]), so a norm
        gen = torch.Generator(device=x["q"].device).manual_seed(7)  # that lands on another row shows in the errors
        scale_q = 1.0 + 3.0 * torch.rand(x["q"].shape[:3] + (1, ), generator=gen, device=x["q"].device)  # [B, N, H, 1]
        scale_k = 0.25 + 0.75 * torch.rand(x["k"].shape[:3] + (1, ), generator=gen, device=x["k"].device)
        raw = dict(x, q=x["q"] * scale_q, k=x["k"] * scale_k)
    else:
        raw = x
    if stage.endswith("gnorm"):  # given on the tf32 grid (the library's rounding); the reference normalises those
        raw = dict(raw, q=_tf32(raw["q"]), k=_tf32(raw["k"]))
        x = dict(x, q=raw["q"] / raw["q"].norm(dim=-1, keepdim=True), k=raw["k"] / raw["k"].norm(dim=-1, keepdim=True))
    o, delta = torch.full_like(x["v"], float("nan")), torch.full_like(x["v"], float("nan"))  # [B, N, HV, V]
    s0 = ladder._committed(x, path[:4]) if commits else x["pool"][x["slots"].long()].double()  # [B, HV, K, V]
    if stage.startswith("real"):  # the library's float64 closed form on the committed state (the bench's random trees)
        pool64 = x["pool"].double()
        pool64[x["slots"].long()] = s0
        want_o, factors = R.gdn_tree_closed_form_ref(*(x[n].double() for n in ("q", "k", "v", "g", "beta")), pool64,
                                                    x["slots"], x["parents"])
        want_d = factors.delta
    else:
        want_o, want_d = ladder._want("commit" if commits else stage, x, *(fused_scratch(x) if solved else (tb, qkd)),
                                      s0)
    fn = launcher(raw, tb, qkd, o, delta, path, variant, grid)
    fn()
    torch.cuda.synchronize()
    if rows:
        row_report(f"{stage} first launch", o, want_o)
    errs = (ladder._rel(o, want_o), 0.0 if stage == "fold" else ladder._rel(delta, want_d))
    if commits:
        errs = (*errs, ladder._rel(x["pool"][x["slots"].long()], s0))
    us = time_fn(fn) if time_fn else None
    if rows and time_fn:
        row_report(f"{stage} after timing", o, want_o)
    if traced and variant[2] >= 6:  # one traced launch after the timing (its stores never timed)
        trace = torch.zeros(grid, 2, 32, 16, dtype=torch.int64, device=o.device)
        assert len(range(0, x["v"].shape[0] * HV, grid)) <= 32, "the trace holds 32 items a program"
        launcher(raw, tb, qkd, o, delta, path, variant, grid, trace)()
        torch.cuda.synchronize()
        return errs, us, trace_summary(trace.cpu(), x["v"].shape[0] * HV)
    return errs, us, None


def run(args, variants, timed: bool) -> int:
    import apply_probe as ladder  # noqa: PLC0415  the Triton stand-in and its float64 references
    import gdn_tree as bench_gdn  # noqa: PLC0415
    B, N = 64, 64
    x = bench_gdn.make_inputs(B, N, "random", 0)
    x["meta"] = bench_gdn.G.tree_meta(x["parents"])
    print(f"random trees: max depth {int(x['meta'].depth.max())}, doublings needed "
          f"{int(x['meta'].depth.max()).bit_length()}", flush=True)
    gen = torch.Generator(device="cuda").manual_seed(1)
    tb = (torch.randn(B * HV * N, N, device="cuda", generator=gen) * 0.1).half()  # [B HV N, N] stand-in scratch
    qkd = (torch.randn(B * HV * N, N, device="cuda", generator=gen) * 0.1).half()
    path = make_path(x)
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    rows, checks, traces = {}, {}, {}
    pool_before = x["pool"].clone()
    time_fn = (lambda fn: bench_gdn.graph_time(fn)[0]) if timed else None
    for variant in variants:
        bk, stages, fold, warps = variant[:4]
        name = f"gluon {STAGE_NAMES[fold]} bk{bk} s{stages} w{warps}" + "".join(
            f" {key}{val}" for key, val in zip(("regs", "L", "P"), variant[4:]))
        while name in rows:  # a repeated variant
            name += "'"
        try:
            checks[name], us, traces[name] = check(x, tb, qkd, make_path(x, variant[6]) if len(variant) > 6 else path,
                                                   variant, nsm, ladder, time_fn, args.trace, args.rows)
        except Exception as exc:  # noqa: BLE001
            print(f"{name}: {type(exc).__name__}: {str(exc)[:2000]}", flush=True)
            continue
        if us is not None:
            rows[name] = us
        print(name, us, checks[name], flush=True)
        if traces[name]:
            for role, phases in traces[name].items():
                print(f"trace {name} {role}: " + ", ".join(f"{k} {v:.0f}" for k, v in phases.items()), flush=True)
    checks["gluon fold keeps the state"] = (float(torch.equal(x["pool"], pool_before)), 0.0)
    if not timed:
        print("checks", checks)
        return 0 if all(max(v) < 1e-2 for n, v in checks.items() if "keeps" not in n) else 1
    cfg = bench_gdn.row_config(dict(x, meta=bench_gdn.G.tree_meta(x["parents"])), "tf32")
    for stage in STAGE_NAMES[:3]:
        checks[f"triton {stage}"], rows[f"triton {stage}"] = ladder._stage(
            x, tb, qkd, stage, cfg.block_v, cfg.block_k, cfg.num_warps, cfg.num_stages)
    allowance, copy, io = ladder.fla_allowance(x, rows, checks)
    for name, us in rows.items():
        print(f"| {name} | {us:.1f} us | {us / allowance:.2f} of the 2x allowance {allowance:.1f} us |")
    for name, errs in checks.items():
        print(f"check {name}: " + " ".join(f"{e:.2e}" for e in errs))
    with open(args.out, "w") as fh:
        json.dump(dict(card=torch.cuda.get_device_name(), copy_tb_s=copy / 1e12, io_bytes=io, us=rows,
                       checks=checks, allowance_us=allowance, trace_cycles={k: v for k, v in traces.items() if v}),
                  fh, indent=1)
    checked = [n for n in checks if "keeps" not in n and n != "fla decode"
               and not ("ahead" in n and any(f" L{cut}" in n for cut in range(1, DOUBLINGS)))]
    return 0 if all(max(checks[n]) < 1e-2 for n in checked) else 1  # an ahead variant with L cut is not an inverse


if __name__ == "__main__":
    sys.exit(main())
