r"""Torch references and baselines for the GDN tree kernels, batched like them (any device, any float dtype).

They take the kernels' arguments and layouts and compute the same quantities the slow, obvious way:

- :func:`gdn_tree_pernode_ref`: the tree definition, one full state per node, level by level (all nodes of one depth,
  all requests, in one batched step): what engines do today with per-node states. Returns ``(o, states)``.
- :func:`gdn_tree_branch_ref`: every root-to-leaf path re-run from ``S0`` as a chain (branch by branch).
- :func:`gdn_tree_closed_form_ref`: the closed form with dense ``[N, N]`` torch ops and a triangular solve.
- :func:`gdn_tree_commit_ref`: the factor commit, written out.

The tests run them in float64 next to :mod:`lumotree.reference`; the benchmark runs the first two as baselines.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..tree_meta import token_trees
from .common import TreeFactors

__all__ = [
    "gdn_gates_ref",
    "l2norm_ref",
    "tree_levels",
    "gdn_tree_pernode_ref",
    "gdn_tree_branch_ref",
    "gdn_tree_closed_form_ref",
    "gdn_tree_commit_ref",
]


def gdn_gates_ref(a, b, A_log, dt_bias, allow_neg_eigval: bool = False):
    """``g = -exp(A_log) softplus(a + dt_bias)``, ``beta = sigmoid(b)`` (``2 sigmoid(b)``): ``[B, N, HV]`` each."""
    g = -torch.exp(A_log) * F.softplus(a + dt_bias)  # [B, N, HV]
    beta = torch.sigmoid(b)  # [B, N, HV]
    return g, 2.0 * beta if allow_neg_eigval else beta


def l2norm_ref(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x * rsqrt(sum x^2 + eps)`` over the last dim."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def tree_levels(parents: torch.Tensor, num_nodes: torch.Tensor | None = None) -> list[tuple[torch.Tensor, ...]]:
    """Nodes grouped by depth across the batch: per level ``(batch [M], node [M], parent_pos [M])`` int64 (CPU),
    ``parent_pos`` the parent's row in the previous level (0 for roots)."""
    levels: dict[int, list[tuple[int, int, int]]] = {}
    position: dict[tuple[int, int], int] = {}
    for b, tree in enumerate(token_trees(parents, num_nodes)):
        for i, d in enumerate(tree.depth.tolist()):
            row = levels.setdefault(d, [])
            position[(b, i)] = len(row)
            row.append((b, i, tree.parents[i]))
    out = []
    for d in sorted(levels):
        rows = [(b, i, position[(b, p)] if p >= 0 else 0) for b, i, p in levels[d]]
        out.append(torch.tensor(rows, dtype=torch.int64).T.contiguous())
    return out


def _prepare(q, k, g, beta, use_qk_l2norm_in_kernel):
    if use_qk_l2norm_in_kernel:
        q, k = l2norm_ref(q), l2norm_ref(k)
    return q, k, torch.exp(g), beta


def gdn_tree_pernode_ref(q, k, v, g, beta, state_pool, slots, parents, *, num_nodes=None, scale=None,
                         use_qk_l2norm_in_kernel=False, levels=None, return_states=True):
    """Tree definition with one state per node, level by level: returns ``(o [B, N, HV, V], states)``.

    ``states``: ``[B, N, HV, K, V]`` (padding zeros) with ``return_states``, else the list of per-level
    ``[M_d, HV, K, V]`` tensors (every node's state is still materialised; one tensor per level keeps each under
    2^31 elements at B=64, N=64). Computes in the promoted dtype of the inputs and the pool. ``levels``: precomputed
    :func:`tree_levels` on the device (no host work in the loop: CUDA-graph capturable).
    """
    B, N, H, K = q.shape
    HV, V = v.shape[2:]
    group = HV // H
    scale = K**-0.5 if scale is None else scale
    dtype = torch.promote_types(q.dtype, state_pool.dtype)
    q, k, alpha, beta = _prepare(q.to(dtype), k.to(dtype), g.to(dtype), beta.to(dtype), use_qk_l2norm_in_kernel)
    v = v.to(dtype)
    S0 = state_pool[slots.long()].to(dtype)  # [B, HV, K, V]
    o = torch.zeros((B, N, HV, V), dtype=dtype, device=q.device)  # [B, N, HV, V]
    if levels is None:
        levels = [tuple(t.to(q.device) for t in lv) for lv in tree_levels(parents, num_nodes)]
    level_states: list[torch.Tensor] = []
    for depth, (bi, ni, pos) in enumerate(levels):
        prev = S0[bi] if depth == 0 else level_states[-1][pos]  # [M, HV, K, V] parent states
        kd = k[bi, ni].repeat_interleave(group, dim=1)  # [M, HV, K]
        qd = q[bi, ni].repeat_interleave(group, dim=1)  # [M, HV, K]
        a_d, b_d = alpha[bi, ni][..., None, None], beta[bi, ni][..., None, None]  # [M, HV, 1, 1]
        kS = torch.einsum("mhk,mhkv->mhv", kd, prev)  # [M, HV, V]
        new = a_d * (prev - b_d * kd[..., None] * kS[..., None, :]) + b_d * kd[..., None] * v[bi, ni][..., None, :]
        level_states.append(new)  # [M, HV, K, V]
        o[bi, ni] = scale * torch.einsum("mhk,mhkv->mhv", qd, new)
    if not return_states:
        return o, level_states
    states = torch.zeros((B, N, HV, K, V), dtype=dtype, device=q.device)  # [B, N, HV, K, V]
    for (bi, ni, _), new in zip(levels, level_states):
        states[bi, ni] = new
    return o, states


def gdn_tree_branch_ref(q, k, v, g, beta, state_pool, slots, parents, *, num_nodes=None, scale=None,
                        use_qk_l2norm_in_kernel=False):
    """Branch by branch: every root-to-leaf path re-run from ``S0`` as a chain (all branches stepped together).

    Returns ``o [B, N, HV, V]`` (a node's output from the first branch through it; padding zeros).
    """
    B, N, H, K = q.shape
    HV, V = v.shape[2:]
    group = HV // H
    scale = K**-0.5 if scale is None else scale
    dtype = torch.promote_types(q.dtype, state_pool.dtype)
    q, k, alpha, beta = _prepare(q.to(dtype), k.to(dtype), g.to(dtype), beta.to(dtype), use_qk_l2norm_in_kernel)
    v = v.to(dtype)
    branches = [(b, tree.path(leaf)) for b, tree in enumerate(token_trees(parents, num_nodes)) for leaf in tree.leaves]
    L, T = len(branches), max(len(p) for _, p in branches)
    batch = torch.tensor([b for b, _ in branches], device=q.device)  # [L]
    node = torch.tensor([p + [p[-1]] * (T - len(p)) for _, p in branches], device=q.device)  # [L, T] padded
    live = torch.tensor([[t < len(p) for t in range(T)] for _, p in branches], device=q.device)  # [L, T]
    S = state_pool[slots.long()].to(dtype)[batch]  # [L, HV, K, V]
    o = torch.zeros((B, N, HV, V), dtype=dtype, device=q.device)
    written = torch.zeros((B, N), dtype=torch.bool, device=q.device)
    for t in range(T):
        ni = node[:, t]
        kd = k[batch, ni].repeat_interleave(group, dim=1)  # [L, HV, K]
        qd = q[batch, ni].repeat_interleave(group, dim=1)
        a_d, b_d = alpha[batch, ni][..., None, None], beta[batch, ni][..., None, None]
        kS = torch.einsum("lhk,lhkv->lhv", kd, S)
        new = a_d * (S - b_d * kd[..., None] * kS[..., None, :]) + b_d * kd[..., None] * v[batch, ni][..., None, :]
        S = torch.where(live[:, t, None, None, None], new, S)
        out_t = scale * torch.einsum("lhk,lhkv->lhv", qd, S)  # [L, HV, V]
        for l_idx in range(L):
            b, i = int(batch[l_idx]), int(ni[l_idx])
            if bool(live[l_idx, t]) and not bool(written[b, i]):
                o[b, i] = out_t[l_idx]
                written[b, i] = True
    return o


def gdn_tree_closed_form_ref(q, k, v, g, beta, state_pool, slots, parents, *, num_nodes=None, scale=None,
                             use_qk_l2norm_in_kernel=False):
    """The closed form with dense torch ops per request: returns ``(o, TreeFactors)`` like the kernel (padding 0)."""
    B, N, H, K = q.shape
    HV, V = v.shape[2:]
    group = HV // H
    scale = K**-0.5 if scale is None else scale
    dtype = torch.promote_types(q.dtype, state_pool.dtype)
    k_raw = k
    q, k, _, beta = _prepare(q.to(dtype), k.to(dtype), g.to(dtype), beta.to(dtype), use_qk_l2norm_in_kernel)
    g, v = g.to(dtype), v.to(dtype)
    o = torch.zeros((B, N, HV, V), dtype=dtype, device=q.device)
    delta = torch.zeros((B, N, HV, V), dtype=dtype, device=q.device)
    log_gamma = torch.zeros((B, N, HV), dtype=dtype, device=q.device)
    for b, tree in enumerate(token_trees(parents, num_nodes)):
        n = tree.num_nodes
        M = torch.tensor(tree.ancestor_mask, device=q.device)  # [n, n]
        strict = M & ~torch.eye(n, dtype=torch.bool, device=q.device)
        Qh = q[b, :n].repeat_interleave(group, dim=1).transpose(0, 1)  # [HV, n, K]
        Kh = k[b, :n].repeat_interleave(group, dim=1).transpose(0, 1)  # [HV, n, K]
        lg = (M.to(dtype) @ g[b, :n]).T  # [HV, n]
        D = torch.exp((lg[:, :, None] - lg[:, None, :]).masked_fill(~M, float("-inf")))  # [HV, n, n]
        bt = beta[b, :n].T[:, :, None]  # [HV, n, 1]
        S0 = state_pool[int(slots[b])].to(dtype)  # [HV, K, V]
        A = bt * (Kh @ Kh.transpose(1, 2) * D).masked_fill(~strict, 0.0)  # [HV, n, n]
        rhs = bt * (v[b, :n].transpose(0, 1) - torch.exp(lg)[..., None] * (Kh @ S0))  # [HV, n, V]
        eye = torch.eye(n, dtype=dtype, device=q.device)
        dl = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)  # [HV, n, V]
        oh = scale * (torch.exp(lg)[..., None] * (Qh @ S0) + (Qh @ Kh.transpose(1, 2) * D) @ dl)  # [HV, n, V]
        o[b, :n], delta[b, :n], log_gamma[b, :n] = oh.transpose(0, 1), dl.transpose(0, 1), lg.T
    k_rnorm = torch.rsqrt((k_raw.to(dtype) ** 2).sum(-1) + 1e-6) if use_qk_l2norm_in_kernel else None
    if k_rnorm is not None and num_nodes is not None:
        k_rnorm = k_rnorm * (torch.arange(N, device=q.device)[None, :] < num_nodes[:, None].to(q.device))[..., None]
    return o, TreeFactors(delta, log_gamma, k_raw, k_rnorm)


def gdn_tree_commit_ref(state_pool, slots, factors: TreeFactors, parents, accepted, *, num_nodes=None):
    """Out of place: ``[B, HV, K, V]`` with
    ``S_a = Gamma_a S0 + sum_{j in path(a)} (Gamma_a / Gamma_j) k_j delta_j^T``."""
    delta, log_gamma, k, k_rnorm = factors
    HV = delta.shape[2]
    group = HV // k.shape[2]
    dtype = torch.promote_types(delta.dtype, state_pool.dtype)
    keys = k.to(dtype) * (k_rnorm.to(dtype)[..., None] if k_rnorm is not None else 1.0)  # [B, N, H, K]
    out = []
    for b, tree in enumerate(token_trees(parents, num_nodes)):
        a = int(accepted[b])
        path = torch.tensor(tree.path(a), device=delta.device)  # [p]
        lg = log_gamma[b].to(dtype)  # [N, HV]
        w = torch.exp(lg[a][None, :] - lg[path])  # [p, HV]
        kp = keys[b, path].repeat_interleave(group, dim=1)  # [p, HV, K]
        upd = torch.einsum("ph,phk,phv->hkv", w, kp, delta[b, path].to(dtype))  # [HV, K, V]
        out.append(torch.exp(lg[a])[:, None, None] * state_pool[int(slots[b])].to(dtype) + upd)
    return torch.stack(out)
