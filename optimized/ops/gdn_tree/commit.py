r"""The in-place GDN tree commit: each request's accepted node's state rebuilt from ``S0`` and the factors on its path.

``S_a = Gamma_a S0 + sum_{j in path(a)} (Gamma_a / Gamma_j) k_j delta_j^T``: one program per (layer, request, value
head, V block, K block) reads its state tile, adds the path's terms (a ``tl.dot`` of ``PATH_BLOCK`` gathered nodes,
or rank-one fp32 updates) and writes it back; layers verified on the same trees commit in one launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..pdl import pdl_supported
from ..tree_meta import tree_size
from ..tree_meta import PATH_BLOCK, WORD_BITS, TreeMeta, accepted_path, path_chunk
from ..checks import check_request_rows, check_tensor
from .common import TreeFactors, check_commit_tree, check_factors, check_precision, pow2_dim, tma_descriptors
from .config import RANK_ONE_BLOCK, KernelConfig, check_config, commit_config, padded_nodes
from .primitives import _tf32_round

__all__ = ["commit_in_place", "add_path_terms"]


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
    (its share of the B = 64 step 18 -> 53 us on an H200)."""
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
    programmatic dependent launch (:mod:`~lumotree.optimized.ops.pdl`): the program loads its ``S0`` tile and finds
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




def commit_in_place(
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
    (:mod:`~lumotree.optimized.ops.pdl`): each program loads its ``S0`` tile and finds the accepted node's path before
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
    check_request_rows("factors.k", k[0])
    pow2_dim("K", K)
    pow2_dim("V", V)
    slots, num_nodes, accepted, meta, has_num = check_commit_tree(parents, slots, num_nodes, accepted, meta, B, N, P,
                                                                  device, validate)
    precision = check_precision(input_precision)
    cfg = config or commit_config(state_pool.shape[0] * B, HV, N, K, V, device, precision)  # the layers' programs
    pdl = bool(pdl) and pdl_supported(device)
    check_config(cfg)
    block_v = min(cfg.block_v, V)
    block_k = min(cfg.block_k, K)
    kr = k_rnorm if k_rnorm is not None else log_gamma  # an unused pointer when k was not normalised
    pool_desc = tma_descriptors(dict(pool=state_pool.view(-1, V)), dict(pool=[block_k, block_v]),
                                 bool(cfg.tma))["pool_desc"]
    _gdn_tree_commit_kernel[(state_pool.shape[0] * B * HV, V // block_v, K // block_k)](
        state_pool, slots, meta.words, num_nodes if has_num else slots, accepted, delta, log_gamma, k, kr,
        B, N, k.stride(1), k.stride(2), k.stride(3),
        state_pool.stride(0), delta.stride(0), log_gamma.stride(0), k.stride(0), kr.stride(0),
        H=H, HV=HV, K=K, V=V, W=meta.words.shape[2], NP=padded_nodes(N),
        PB=RANK_ONE_BLOCK if cfg.rank_one else PATH_BLOCK, BV=block_v,
        BK=block_k, L2NORM=k_rnorm is not None, PRECISION=precision, WORD_BITS=WORD_BITS, PDL=pdl, HAS_NUM=has_num,
        RANK_ONE=cfg.rank_one, pool_desc=pool_desc, TMA=pool_desc is not None,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **({"launch_pdl": True} if pdl else {}),
        **({"maxnreg": cfg.max_registers} if cfg.max_registers else {}),
    )
    return state_pool if layered else state_pool[0]
