r"""Deferred GDN tree commits: the accepted path recorded per pool slot, applied to the state later.

:func:`~lumotree.optimized.ops.gdn_tree.gdn_tree_commit` rebuilds the accepted node's state in place:
``S_a = Gamma_a S0 + sum_{j in path(a)} (Gamma_a / Gamma_j) k_j delta_j^T``, one read and one write of every state.
A verify that streams the state anyway can apply that update to each chunk as it reads it, and write it back, so
the commit's own pass over the state goes (:func:`~lumotree.optimized.ops.gdn_tree.fused.fused_verify`). Between the
two, the
update is held here, per pool slot, in the form that verify reads::

    S_true = gamma_a S + kpt dp        kpt = K^_p^T  [K, PATH] per key head,  dp = diag(w) Delta_p  [PATH, V]
                                       per value head

with ``K^_p`` the path's keys as the verify used them (``k * k_rnorm`` when it normalised), ``w_j = Gamma_a /
Gamma_j`` and ``gamma_a = Gamma_a`` (both per value head). The keys are held once per key head (the value heads
of a group share them; the decays differ, so they ride on the Delta rows). ``kpt`` is written whole (zero columns
past the path), so a reader needs no path length; ``dp``'s rows past the path are never read into a nonzero
product. ``kpt`` and ``dp`` are held
rounded to tf32 (round to nearest): the fused verify multiplies them on the tensor cores in tf32, which would
otherwise truncate each operand (a bias of up to 2^-10 per operand: state errors of 5.0-7.7e-4 against 1.9-3.0e-4
rounded, measured), and a flush multiplies the same operands in fp32, so both
leave the same state: the commit's up to the rounding of ``kpt`` and ``dp`` (at most ``2^-11`` relative each).
The pool and a :class:`PendingCommits` together hold the state: ``S_true = S`` where ``active`` is 0.

:func:`gdn_tree_record` records (a path longer than ``PATH`` nodes, or a slot whose previous record is still
pending, is applied to the pool at once), :func:`gdn_tree_flush` applies what is pending. Any other reader of
the pool (the unfused verify, a copy, an eviction) must flush first.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..checks import check_slots, check_tensor
from ..tree_meta import WORD_BITS, TreeMeta, ancestor_words, path_chunk, path_of_words, tree_size
from .commit import add_path_terms
from .common import TreeFactors, check_commit_tree, check_factors, pow2_dim
from .primitives import _tf32_round

__all__ = ["PATH_NODES", "PendingCommits", "pending_commits", "pending_layout", "gdn_tree_record", "gdn_tree_flush",
           "check_pool_and_pending", "build_record_for_sm90"]

RECORD_WARPS = 4  # the record's warps a program and their register cap (None: ptxas chooses). Its share of the
RECORD_MAX_REGISTERS: int | None = 64  # B = 64 step on an H200: 2 warps uncapped 14.5-15.2 us, at 128 registers
# 16.4, 4 warps at 64 registers 12.2-12.9 (a few spill stores, more programs resident), 1 warp 17.4, 4 warps
# uncapped 15.4
PATH_NODES = 16  # the longest path a record holds (the fused verify's path tile: 16 nodes, 8 KiB at K = 128)


class PendingCommits(NamedTuple):
    """Per pool slot and value head, the update its state still lacks: ``S_true = gamma_a S + kpt dp``.

    ``kpt: [P, H, K, PATH]`` the path's keys ``K^_p^T`` per key head (zero columns past the path), ``dp: [P, PATH,
    HV, V]`` the path's Delta rows times ``w``, both fp32 holding tf32 values; ``gamma_a: [P, HV]`` fp32, ``active:
    [P, HV]`` int32 (1: pending). Made by
    :func:`pending_commits`; written by :func:`gdn_tree_record`, cleared by :func:`gdn_tree_flush`."""

    kpt: torch.Tensor
    dp: torch.Tensor
    gamma_a: torch.Tensor
    active: torch.Tensor


def pending_commits(state_pool: torch.Tensor, key_heads: int, path: int = PATH_NODES) -> PendingCommits:
    """Empty :class:`PendingCommits` for ``state_pool: [P, HV, K, V]`` of a layer with ``key_heads`` (H) key heads
    (nothing pending), ``path`` nodes a record."""
    check_tensor("state_pool", state_pool, (None, None, None, None), "P, HV, K, V", (torch.float32,),
                 state_pool.device if isinstance(state_pool, torch.Tensor) else torch.device("cpu"), contiguous=True)
    if not isinstance(path, int) or path < 16 or path & (path - 1):
        raise ValueError(f"path must be a power of two >= 16 (the products' smallest tile), got {path!r}")
    P, HV, K, V = state_pool.shape
    if not isinstance(key_heads, int) or key_heads < 1 or HV % key_heads:
        raise ValueError(f"key_heads must divide the pool's HV = {HV} value heads, got {key_heads!r}")
    dev = state_pool.device
    shapes = pending_layout(P, key_heads, HV, K, V, path)
    return PendingCommits(**{name: (torch.ones if name == "gamma_a" else torch.zeros)(shape, dtype=dtype, device=dev)
                             for name, (shape, dtype) in shapes.items()})


def pending_layout(P: int, key_heads: int, HV: int, K: int, V: int, path: int = PATH_NODES
                   ) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The shapes and dtypes of :class:`PendingCommits`' tensors for ``P`` slots (what :func:`pending_commits`
    allocates): ``kpt [P, H, K, path]``, ``dp [P, path, HV, V]``, ``gamma_a [P, HV]`` fp32, ``active [P, HV]``
    int32."""
    f32 = torch.float32
    return dict(kpt=((P, key_heads, K, path), f32), dp=((P, path, HV, V), f32), gamma_a=((P, HV), f32),
                active=((P, HV), torch.int32))


@triton.jit
def _apply_pending(pool_ptr, kpt_ptr, dp_ptr, slot, hv, gamma, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
                   V: tl.constexpr, PATH: tl.constexpr, BV: tl.constexpr):
    """``S <- gamma S + kpt dp`` for pool item ``slot * HV + hv`` (``kpt`` of its key head), ``BV`` columns at a
    time (fp32 products)."""
    item = slot * HV + hv
    krows = tl.arange(0, K)  # [K]
    lanes = tl.arange(0, PATH)  # [PATH]
    kpt = tl.load(kpt_ptr + ((slot * H + hv // (HV // H)) * K + krows[:, None]) * PATH + lanes[None, :])  # [K, PATH]
    for v0 in range(0, V, BV):
        vcols = v0 + tl.arange(0, BV)  # [BV]
        ptrs = pool_ptr + item * (K * V) + krows[:, None] * V + vcols[None, :]  # [K, BV]
        dp = tl.load(dp_ptr + ((slot * PATH + lanes[:, None]) * HV + hv) * V + vcols[None, :])  # [PATH, BV]
        tl.store(ptrs, tl.dot(kpt, dp, tl.load(ptrs) * gamma, input_precision="ieee"))


@triton.jit
def _record_kernel(
    pool_ptr, kpt_ptr, dp_ptr, gamma_ptr, active_ptr, slots_ptr, words_ptr, num_nodes_ptr, accepted_ptr,
    delta_ptr, log_gamma_ptr, k_ptr, k_rnorm_ptr, N, s_kb, s_kn, s_kh,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, W: tl.constexpr, NP: tl.constexpr,
    PATH: tl.constexpr, BV: tl.constexpr, L2NORM: tl.constexpr, HAS_NUM: tl.constexpr, WORD_BITS: tl.constexpr,
):  # fmt: skip
    """One program per (request, key head) and the ``G = HV / H`` value heads of its group: a pending entry of
    the slot is applied first (every value head's, before the shared ``kpt`` is rewritten); then the path
    root..a (``a = accepted[b]``) is recorded: ``kpt = K^_p^T`` once, each value head's ``dp = diag(w) Delta_p``
    rows (both rounded to tf32), ``gamma_a`` and ``active = 1``; or, past ``PATH`` nodes, applied to the pool at
    once (``S <- Gamma_a S + sum_j (Gamma_a / Gamma_j) k^_j delta_j^T``, ``PATH`` nodes a product, ``active =
    0``)."""
    pid = tl.program_id(0)
    b = pid // H
    h = pid % H
    G: tl.constexpr = HV // H
    b64 = b.to(tl.int64)
    slot = tl.load(slots_ptr + b).to(tl.int64)
    node = tl.load(accepted_ptr + b)
    n_b = tree_size(num_nodes_ptr, b, N, HAS_NUM)
    word = ancestor_words(words_ptr + (b64 * N + node) * W, n_b, NP, WORD_BITS)  # [NP] in flight with the checks
    for j in tl.static_range(G):  # the previous record was never applied: apply it now
        if tl.load(active_ptr + slot * HV + h * G + j) != 0:
            _apply_pending(pool_ptr, kpt_ptr, dp_ptr, slot, h * G + j, tl.load(gamma_ptr + slot * HV + h * G + j),
                           H, HV, K, V, PATH, BV)
    tl.debug_barrier()  # every thread's reads of the old kpt before any thread rewrites it
    on_path, rank, path_len = path_of_words(word, NP, WORD_BITS)  # the path root..a
    krows = tl.arange(0, K)  # [K]
    vcols = tl.arange(0, V)  # [V]
    lanes = tl.arange(0, PATH)  # [PATH]
    if path_len <= PATH:
        idx = path_chunk(on_path, rank, 0, NP, PATH)  # [PATH] node of each path entry (0 past the end)
        live = lanes < path_len  # [PATH]
        k_p = tl.load(k_ptr + b64 * s_kb + idx[:, None] * s_kn + h * s_kh + krows[None, :], mask=live[:, None],
                      other=0.0).to(tl.float32)  # [PATH, K] (0 past the path)
        if L2NORM:
            k_p = k_p * tl.load(k_rnorm_ptr + (b64 * N + idx) * H + h, mask=live, other=0.0)[:, None]
        kpt = _tf32_round(tl.trans(k_p), "tf32")  # [K, PATH]
        tl.store(kpt_ptr + ((slot * H + h) * K + krows[:, None]) * PATH + lanes[None, :], kpt)
        for j in tl.static_range(G):
            hv = h * G + j
            lg_a = tl.load(log_gamma_ptr + (b64 * N + node) * HV + hv)
            lg = tl.load(log_gamma_ptr + (b64 * N + idx) * HV + hv, mask=live, other=0.0)  # [PATH]
            weight = tl.exp(lg_a - lg)  # [PATH] Gamma_a / Gamma_j
            d = tl.load(delta_ptr + ((b64 * N + idx[:, None]) * HV + hv) * V + vcols[None, :],
                        mask=live[:, None]).to(tl.float32)
            tl.store(dp_ptr + ((slot * PATH + lanes[:, None]) * HV + hv) * V + vcols[None, :],
                     _tf32_round(d * weight[:, None], "tf32"), mask=live[:, None])
            tl.store(gamma_ptr + slot * HV + hv, tl.exp(lg_a))
            tl.store(active_ptr + slot * HV + hv, 1)
    else:  # too long to hold: the commit itself, PATH path entries a product
        for j in tl.static_range(G):
            hv = h * G + j
            lg_a = tl.load(log_gamma_ptr + (b64 * N + node) * HV + hv)
            for v0 in range(0, V, BV):
                cols = v0 + tl.arange(0, BV)  # [BV]
                ptrs = pool_ptr + (slot * HV + hv) * (K * V) + krows[:, None] * V + cols[None, :]  # [K, BV]
                s = tl.load(ptrs) * tl.exp(lg_a)  # [K, BV] Gamma_a S0
                s = add_path_terms(s, on_path, rank, path_len, lg_a, delta_ptr, log_gamma_ptr, k_ptr, k_rnorm_ptr,
                                   b64, N, s_kb, s_kn, s_kh, h, hv, cols, krows, H, HV, V, NP, PATH, L2NORM, "ieee",
                                   WEIGHT_KEYS=True)
                tl.store(ptrs, s)
            tl.store(active_ptr + slot * HV + hv, 0)


@triton.jit
def _flush_kernel(pool_ptr, kpt_ptr, dp_ptr, gamma_ptr, active_ptr, slots_ptr, H: tl.constexpr, HV: tl.constexpr,
                  K: tl.constexpr, V: tl.constexpr, PATH: tl.constexpr, BV: tl.constexpr):
    """One program per (listed slot, value head): ``S <- gamma_a S + kpt dp`` where pending, then ``active = 0``
    (``kpt`` is only read: the value heads of a group may run in any order)."""
    pid = tl.program_id(0)
    slot = tl.load(slots_ptr + pid // HV).to(tl.int64)
    hv = pid % HV
    item = slot * HV + hv
    if tl.load(active_ptr + item) != 0:
        _apply_pending(pool_ptr, kpt_ptr, dp_ptr, slot, hv, tl.load(gamma_ptr + item), H, HV, K, V, PATH, BV)
        tl.store(active_ptr + item, 0)


def check_pool_and_pending(state_pool: object, pending: object) -> tuple[int, int, int, int, int, int]:
    """``state_pool: [P, HV, K, V]`` fp32 and a :class:`PendingCommits` that matches it: ``(P, H, HV, K, V,
    PATH)``."""
    device = state_pool.device if isinstance(state_pool, torch.Tensor) else torch.device("cpu")
    check_tensor("state_pool", state_pool, (None,) * 4, "P, HV, K, V", (torch.float32,), device, contiguous=True)
    P, HV, K, V = state_pool.shape
    pow2_dim("K", K)
    pow2_dim("V", V)
    if not isinstance(pending, PendingCommits):
        raise TypeError(f"pending must be the PendingCommits of pending_commits(), got {type(pending).__name__}")
    check_tensor("pending.kpt", pending.kpt, (P, None, K, None), "P, H, K, PATH", (torch.float32,), device,
                 contiguous=True)
    H, path = pending.kpt.shape[1], pending.kpt.shape[3]
    if H < 1 or HV % H:
        raise ValueError(f"pending.kpt holds H = {H} key heads, which does not divide the pool's HV = {HV}")
    check_tensor("pending.dp", pending.dp, (P, path, HV, V), "P, PATH, HV, V", (torch.float32,), device,
                 contiguous=True)
    check_tensor("pending.gamma_a", pending.gamma_a, (P, HV), "P, HV", (torch.float32,), device, contiguous=True)
    check_tensor("pending.active", pending.active, (P, HV), "P, HV", (torch.int32,), device, contiguous=True)
    return P, H, HV, K, V, path


def _block_v(V: int) -> int:
    return min(V, 32)


def gdn_tree_record(
    pending: PendingCommits,
    state_pool: torch.Tensor,
    slots: torch.Tensor,
    factors: TreeFactors,
    parents: torch.Tensor,
    accepted: torch.Tensor,
    *,
    num_nodes: torch.Tensor | None = None,
    meta: TreeMeta | None = None,
    validate: bool = True,
) -> PendingCommits:
    """Record each request's accepted path in ``pending`` instead of committing it to the pool.

    Arguments as :func:`~lumotree.optimized.ops.gdn_tree.gdn_tree_commit` for one layer (``state_pool: [P, HV, K, V]``
    fp32, ``factors`` from the verify of the same trees, slots distinct). Per (request, key head): a slot whose
    previous record is still pending has it applied first; a path of at most ``PATH`` nodes is recorded
    (``kpt``, each value head's ``dp``, both rounded to tf32, ``gamma_a``, ``active = 1``); a longer one is
    committed to the pool at once (fp32). Afterwards ``gamma_a S + kpt dp`` (or ``S``, where nothing is pending)
    is what ``gdn_tree_commit`` would have left in the pool, up to the tf32 rounding of ``kpt`` and ``dp`` (module
    docstring) and fp32 rounding. Returns ``pending``."""
    P, H_pending, HV, K, V, path = check_pool_and_pending(state_pool, pending)
    device = state_pool.device
    delta, log_gamma, k, k_rnorm, B, N, H = check_factors(factors, (), HV, K, V, device)
    if H != H_pending:
        raise ValueError(f"factors.k has H = {H} key heads; pending holds {H_pending} (pending_commits(pool, {H}))")
    for name, t in (("factors.delta", delta), ("factors.log_gamma", log_gamma), ("factors.k_rnorm", k_rnorm)):
        if t is not None and not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (strides {tuple(t.stride())})")
    slots, num_nodes, accepted, meta, has_num = check_commit_tree(parents, slots, num_nodes, accepted, meta, B, N, P,
                                                                  device, validate)
    kr = k_rnorm if k_rnorm is not None else log_gamma  # an unused pointer when k was not normalised
    _record_kernel[(B * H, )](
        state_pool, pending.kpt, pending.dp, pending.gamma_a, pending.active, slots, meta.words,
        num_nodes if has_num else slots, accepted, delta, log_gamma, k, kr, N, k.stride(0), k.stride(1), k.stride(2),
        H=H, HV=HV, K=K, V=V, W=meta.words.shape[2], NP=triton.next_power_of_2(N), PATH=path, BV=_block_v(V),
        L2NORM=k_rnorm is not None, HAS_NUM=has_num, WORD_BITS=WORD_BITS, **_record_options(RECORD_MAX_REGISTERS),
    )
    return pending


def _record_options(max_registers: int | None) -> dict:
    """The record's launch options: ``RECORD_WARPS``, and ``max_registers`` as the cap unless None."""
    return dict(num_warps=RECORD_WARPS) if max_registers is None else dict(num_warps=RECORD_WARPS,
                                                                          maxnreg=max_registers)


def build_record_for_sm90(*, H: int = 16, HV: int = 32, K: int = 128, V: int = 128, N: int = 64, norm: bool = True,
                          sizes: bool = False, max_registers: int | None = None):
    """Compiles the record kernel for sm_90 as :func:`gdn_tree_record` launches it (fp32 factors, every pointer and
    integer argument 16-aligned as the JIT specialises them; ``max_registers``: the cap, None uncapped), without a GPU:
    Triton's compiled kernel (``.asm`` holds the cubin). For the tests' spill check (a refactor once left it 32
    registers and 3.4 KB of spills)."""
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.compiler import ASTSource  # noqa: PLC0415

    kernel = _record_kernel
    constexprs = dict(H=H, HV=HV, K=K, V=V, W=(N + WORD_BITS - 1) // WORD_BITS, NP=triton.next_power_of_2(N),
                      PATH=PATH_NODES, BV=_block_v(V), L2NORM=norm, HAS_NUM=sizes, WORD_BITS=WORD_BITS)
    ints = ("slots_ptr", "words_ptr", "num_nodes_ptr", "accepted_ptr", "active_ptr")
    signature = {n: "constexpr" if n in constexprs else ("*i32" if n in ints else "*fp32") if n.endswith("_ptr")
                 else "i32" for n in kernel.arg_names}
    aligned = {(i, ): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names) if n not in constexprs}
    source = ASTSource(fn=kernel, signature=signature, attrs=aligned,
                       constexprs={(kernel.arg_names.index(n), ): v for n, v in constexprs.items()})
    return triton.compile(source, target=GPUTarget("cuda", 90, 64), options=_record_options(max_registers))


def gdn_tree_flush(pending: PendingCommits, state_pool: torch.Tensor, slots: torch.Tensor | None = None, *,
                   validate: bool = True) -> torch.Tensor:
    """Apply what is pending for ``slots: [S]`` (every slot when None) to ``state_pool`` in place: ``S <- gamma_a S
    + kpt dp`` where ``active``, which is then cleared. Slots must be distinct (``validate=False`` skips the
    host-side range and distinctness check, e.g. inside CUDA-graph capture). Returns ``state_pool``."""
    P, H, HV, K, V, path = check_pool_and_pending(state_pool, pending)
    device = state_pool.device
    if slots is None:
        slots = torch.arange(P, dtype=torch.int32, device=device)
    else:
        check_tensor("slots", slots, (None, ), "S", (torch.int32, torch.int64), device)
        slots = check_slots(slots, slots.shape[0], P, device, validate, distinct=True)
    if slots.shape[0]:
        _flush_kernel[(slots.shape[0] * HV, )](state_pool, pending.kpt, pending.dp, pending.gamma_a, pending.active,
                                               slots, H=H, HV=HV, K=K, V=V, PATH=path, BV=_block_v(V),
                                               num_warps=4)
    return state_pool
