r"""Gated DeltaNet, exact: the recurrence on chains and trees, the tree closed form, and the factor commit.

Shapes (single sequence, no batch), as flash-linear-attention without the batch dim:
``q, k: [N, H, K]``, ``v: [N, HV, V]``, ``alpha, beta: [N, HV]``, ``S0: [HV, K, V]``, output ``o: [N, HV, V]``.
Grouped value heads (GVA): value head ``h`` reads q/k head ``h // (HV // H)``. ``alpha = exp(g)`` is the decay
factor (multiplicative, so everything stays rational), ``beta`` the write strength in ``[0, 2]``.

Recurrence per value head (S is K x V)::

    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,        o_t = scale * S_t^T q_t

On a tree, node i applies one step to its parent's state (the root's parent state is ``S0``).

Closed form (all nodes at once), with path products ``Gamma_i = prod_{j in path(i)} alpha_j`` and
``D_ij = M_ij Gamma_i / Gamma_j`` (computed here as the product of alpha over ``path(i) \ path(j)``, a polynomial)::

    A     = diag(beta) (K K^T ⊙ D ⊙ M°)                          strictly lower triangular
    Delta = (I + A)^{-1} diag(beta) (V - diag(Gamma) K S0)        unit-lower-triangular solve
    O     = scale * (diag(Gamma) Q S0 + (Q K^T ⊙ D) Delta)
    S_i   = Gamma_i S0 + sum_{j in path(i)} (Gamma_i / Gamma_j) k_j delta_j^T

Derivation: with ``delta_i := beta_i (v_i - alpha_i S_{parent(i)}^T k_i)`` the recurrence reads
``S_i = alpha_i S_{parent(i)} + k_i delta_i^T``; unrolling along the path gives ``S_i`` above, and substituting it
back into ``delta_i`` gives row i of the triangular system. See ``docs/closed-form.md`` and the proofs in
``lumotree.proofs`` that check this code on sympy and Z3 terms.

Every function here is written once and runs on float64 arrays and on object arrays of Fraction, sympy or z3 terms.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .numerics import check_finite, check_range, check_shape, coerce_inputs, default_scale
from .tree import TokenTree

__all__ = [
    "GDNFactors",
    "chain",
    "tree_recurrent",
    "tree_closed_form",
    "commit",
    "step",
    "path_decay",
    "check_gdn_inputs",
]


class GDNFactors(NamedTuple):
    """Token-level factors of a verified tree: all a commit needs besides ``S0``.

    ``delta: [N, HV, V]`` the solved update vectors, ``gamma: [N, HV]`` the path decay ``Gamma_i`` (the GPU keeps
    ``log Gamma``), ``k: [N, H, K]`` the (normalised) keys as used.
    """

    delta: np.ndarray
    gamma: np.ndarray
    k: np.ndarray


def check_gdn_inputs(
    q: Any, k: Any, v: Any, alpha: Any, beta: Any, S0: Any, scale: Any, num_nodes: int | None = None
) -> tuple[dict[str, np.ndarray], Any]:
    """Coerce to one number system and validate shapes, finiteness and gate ranges; returns (arrays, scale)."""
    arrays = coerce_inputs(q=q, k=k, v=v, alpha=alpha, beta=beta, S0=S0)
    q, k, v, alpha, beta, S0 = (arrays[n] for n in ("q", "k", "v", "alpha", "beta", "S0"))
    check_shape("q", q, (None, None, None), "N, H, K")
    N, H, K = q.shape
    if num_nodes is not None and N != num_nodes:
        raise ValueError(f"q has {N} tokens but the tree has {num_nodes} nodes")
    if N == 0:
        raise ValueError("q has no tokens (N = 0)")
    check_shape("k", k, (N, H, K), "N, H, K")
    check_shape("v", v, (N, None, None), "N, HV, V")
    HV, V = v.shape[1], v.shape[2]
    if HV % H != 0:
        raise ValueError(f"v has HV = {HV} value heads, not a multiple of H = {H} q/k heads (GVA)")
    check_shape("alpha", alpha, (N, HV), "N, HV")
    check_shape("beta", beta, (N, HV), "N, HV")
    check_shape("S0", S0, (HV, K, V), "HV, K, V")
    for name in ("q", "k", "v", "alpha", "beta", "S0"):
        check_finite(name, arrays[name])
    check_range("alpha", alpha, 0, 1)
    check_range("beta", beta, 0, 2)
    exact = q.dtype == object
    if scale is None:
        scale = default_scale(K, exact)
    elif exact and isinstance(scale, float):
        raise TypeError("scale is a float but the inputs are exact; pass a Fraction or an exact expression")
    return arrays, scale


def step(S: np.ndarray, q_t: np.ndarray, k_t: np.ndarray, v_t: np.ndarray, alpha_t: Any, beta_t: Any, scale: Any):
    """One recurrence step for one value head: returns ``(o_t [V], S_t [K, V])``."""
    kS = k_t @ S  # [V]
    # arrays on the left of every product: a z3 scalar on the left does not defer to numpy
    S_new = (S - np.outer(k_t, kS) * beta_t) * alpha_t + np.outer(k_t, v_t) * beta_t  # [K, V]
    return (q_t @ S_new) * scale, S_new


def _zeros(shape: tuple[int, ...], like: np.ndarray) -> np.ndarray:
    return np.zeros(shape, dtype=object) if like.dtype == object else np.zeros(shape, dtype=np.float64)


def chain(q, k, v, alpha, beta, S0, scale=None):
    """The recurrence over N tokens in order: returns ``(o [N, HV, V], S_last [HV, K, V])``."""
    a, scale = check_gdn_inputs(q, k, v, alpha, beta, S0, scale)
    q, k, v, alpha, beta, S0 = (a[n] for n in ("q", "k", "v", "alpha", "beta", "S0"))
    N, H, _ = q.shape
    HV, V = v.shape[1:]
    group = HV // H
    o = _zeros((N, HV, V), q)
    S = S0.copy()
    for t in range(N):
        for h in range(HV):
            o[t, h], S[h] = step(S[h], q[t, h // group], k[t, h // group], v[t, h], alpha[t, h], beta[t, h], scale)
    return o, S


def tree_recurrent(q, k, v, alpha, beta, S0, tree: TokenTree, scale=None):
    """The tree definition: node i steps from its parent's state. Returns ``(o [N, HV, V], states [N, HV, K, V])``."""
    a, scale = check_gdn_inputs(q, k, v, alpha, beta, S0, scale, num_nodes=tree.num_nodes)
    q, k, v, alpha, beta, S0 = (a[n] for n in ("q", "k", "v", "alpha", "beta", "S0"))
    N, H, K = q.shape
    HV, V = v.shape[1:]
    group = HV // H
    o = _zeros((N, HV, V), q)
    states = _zeros((N, HV, K, V), q)
    for i, p in enumerate(tree.parents):
        parent_state = S0 if p < 0 else states[p]
        for h in range(HV):
            o[i, h], states[i, h] = step(
                parent_state[h], q[i, h // group], k[i, h // group], v[i, h], alpha[i, h], beta[i, h], scale
            )
    return o, states


def path_decay(alpha: np.ndarray, tree: TokenTree) -> tuple[np.ndarray, np.ndarray]:
    """Path products for one value head's ``alpha: [N]``.

    Returns ``gamma [N]`` with ``gamma_i = prod_{l in path(i)} alpha_l`` and ``D [N, N]`` with
    ``D_ij = prod_{l in path(i) \\ path(j)} alpha_l`` for j an ancestor of i (inclusive), else 0. ``D_ij`` equals
    ``gamma_i / gamma_j`` but is computed without division, so it is a polynomial in alpha.
    """
    N = tree.num_nodes
    gamma = np.empty(N, dtype=alpha.dtype)
    D = _zeros((N, N), alpha)
    for i, p in enumerate(tree.parents):
        gamma[i] = alpha[i] if p < 0 else gamma[p] * alpha[i]
        D[i, i] = 1
        if p >= 0:
            for j in tree.path(p):
                D[i, j] = D[p, j] * alpha[i]
    return gamma, D


def tree_closed_form(q, k, v, alpha, beta, S0, tree: TokenTree, scale=None):
    """All nodes at once from ``S0``: returns ``(o [N, HV, V], GDNFactors)``; no per-node state is formed.

    Per value head: ``A = diag(beta)(K K^T ⊙ D ⊙ M°)``, ``Delta = (I + A)^{-1} diag(beta)(V - diag(Gamma) K S0)`` by
    forward substitution over ancestors, ``O = scale (diag(Gamma) Q S0 + (Q K^T ⊙ D) Delta)``.
    """
    a, scale = check_gdn_inputs(q, k, v, alpha, beta, S0, scale, num_nodes=tree.num_nodes)
    q, k, v, alpha, beta, S0 = (a[n] for n in ("q", "k", "v", "alpha", "beta", "S0"))
    N, H, _ = q.shape
    HV, V = v.shape[1:]
    group = HV // H
    strict = tree.ancestor_mask & ~np.eye(N, dtype=bool)  # M°: [N, N]
    o = _zeros((N, HV, V), q)
    delta = _zeros((N, HV, V), q)
    gamma = _zeros((N, HV), q)
    for h in range(HV):
        Qh, Kh = q[:, h // group], k[:, h // group]  # [N, K]
        gamma_h, D = path_decay(alpha[:, h], tree)  # [N], [N, N]
        A = beta[:, h, None] * np.where(strict, (Kh @ Kh.T) * D, 0)  # [N, N] strictly lower
        rhs = beta[:, h, None] * (v[:, h] - gamma_h[:, None] * (Kh @ S0[h]))  # [N, V]
        delta_h = _zeros((N, V), q)
        for i in range(N):  # unit-lower-triangular solve; only ancestors contribute
            acc = rhs[i]
            for j in tree.path(i)[:-1]:
                acc = acc - delta_h[j] * A[i, j]
            delta_h[i] = acc
        o[:, h] = (gamma_h[:, None] * (Qh @ S0[h]) + ((Qh @ Kh.T) * D) @ delta_h) * scale
        delta[:, h] = delta_h
        gamma[:, h] = gamma_h
    return o, GDNFactors(delta=delta, gamma=gamma, k=k.copy())


def commit(S0, factors: GDNFactors, tree: TokenTree, node: int):
    """The state of ``node`` rebuilt from ``S0`` and the factors on its path:
    ``S = Gamma_a S0 + sum_{j in path(a)} (Gamma_a / Gamma_j) k_j delta_j^T``. Returns ``[HV, K, V]``.
    """
    delta, gamma, k = factors
    arrays = coerce_inputs(S0=S0, delta=delta, gamma=gamma, k=k)
    S0, delta, gamma, k = (arrays[n] for n in ("S0", "delta", "gamma", "k"))
    N = tree.num_nodes
    check_shape("factors.delta", delta, (N, None, None), "N, HV, V")
    HV, V = delta.shape[1:]
    check_shape("factors.gamma", gamma, (N, HV), "N, HV")
    check_shape("factors.k", k, (N, None, None), "N, H, K")
    H, K = k.shape[1:]
    if HV % H != 0:
        raise ValueError(f"factors.delta has HV = {HV} value heads, not a multiple of H = {H} (factors.k)")
    check_shape("S0", S0, (HV, K, V), "HV, K, V")
    group = HV // H
    path = tree.path(node)
    a = path[-1]
    S = _zeros((HV, K, V), S0)
    for h in range(HV):
        acc = S0[h] * gamma[a, h]
        for j in path:
            acc = acc + np.outer(k[j, h // group], delta[j, h]) * (gamma[a, h] / gamma[j, h])
        S[h] = acc
    return S
