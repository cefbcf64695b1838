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

Nothing here divides by a path product: ``Gamma_i / Gamma_j`` is always formed as the product of the alphas on the
path strictly below j, so a decay of exactly 0 (or one that underflows in float64) is handled like any other.

Derivation: with ``delta_i := beta_i (v_i - alpha_i S_{parent(i)}^T k_i)`` the recurrence reads
``S_i = alpha_i S_{parent(i)} + k_i delta_i^T``; unrolling along the path gives ``S_i`` above, and substituting it
back into ``delta_i`` gives row i of the triangular system. See ``docs/closed-form.md`` and the proofs in
``lumotree.proofs`` that check this code on sympy and Z3 terms.

Every function here is written once and runs on float64 arrays and on object arrays of Fraction, sympy or z3 terms.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .numerics import (
    check_finite,
    check_range,
    check_scale,
    check_shape,
    coerce_inputs,
    default_scale,
    validate_weight_fields,
)
from .solve import SCHEDULES, solve_unit_lower
from .tree import TokenTree, check_tree

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
    ``log Gamma``), ``k: [N, H, K]`` the (normalised) keys as used, ``alpha: [N, HV]`` each node's own decay (the
    commit multiplies these along the path instead of dividing path products; the GPU has them as the differences
    of ``log Gamma`` along an edge).
    """

    delta: np.ndarray
    gamma: np.ndarray
    k: np.ndarray
    alpha: np.ndarray


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
    if H == 0 or K == 0:
        raise ValueError(f"q has shape {tuple(q.shape)}: H (q/k heads) and K (key dim) must be at least 1")
    check_shape("k", k, (N, H, K), "N, H, K")
    check_shape("v", v, (N, None, None), "N, HV, V")
    HV, V = v.shape[1], v.shape[2]
    if HV == 0 or V == 0:
        raise ValueError(f"v has shape {tuple(v.shape)}: HV (value heads) and V (value dim) must be at least 1")
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
    else:
        check_scale(scale, exact)
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
    tree = check_tree(tree)
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
    tree = check_tree(tree)
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


def tree_closed_form(q, k, v, alpha, beta, S0, tree: TokenTree, scale=None, solve: str = "substitution"):
    """All nodes at once from ``S0``: returns ``(o [N, HV, V], GDNFactors)``; no per-node state is formed.

    Per value head: ``A = diag(beta)(K K^T ⊙ D ⊙ M°)``, ``Delta = (I + A)^{-1} diag(beta)(V - diag(Gamma) K S0)``,
    ``O = scale (diag(Gamma) Q S0 + (Q K^T ⊙ D) Delta)``. ``solve`` is the schedule of the triangular solve
    (:data:`~lumotree.reference.solve.SCHEDULES`): forward substitution over ancestors by default, or the kernels'
    doubling product / inverse by halves.
    """
    tree = check_tree(tree)
    if solve not in SCHEDULES:
        raise ValueError(f"solve = {solve!r} is not one of {SCHEDULES}")
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
        delta_h = solve_unit_lower(A, rhs, tree, solve)  # [N, V] (I + A)^{-1} rhs; only ancestors contribute
        o[:, h] = (gamma_h[:, None] * (Qh @ S0[h]) + ((Qh @ Kh.T) * D) @ delta_h) * scale
        delta[:, h] = delta_h
        gamma[:, h] = gamma_h
    return o, GDNFactors(delta=delta, gamma=gamma, k=k.copy(), alpha=alpha.copy())


def commit(S0, factors: GDNFactors, tree: TokenTree, node: int):
    """The state of ``node`` rebuilt from ``S0`` and the factors on its path:
    ``S = Gamma_a S0 + sum_{j in path(a)} (Gamma_a / Gamma_j) k_j delta_j^T``. Returns ``[HV, K, V]``.

    ``Gamma_a / Gamma_j`` is formed as the product of ``factors.alpha`` over the path nodes strictly below j (walking
    the path from ``a`` up), never as a quotient: exact for every alpha in ``[0, 1]``, including 0, and a polynomial
    in the inputs on exact number systems; in float64 a decay that underflows gives 0, not 0 / 0.
    """
    tree = check_tree(tree)
    if not isinstance(factors, GDNFactors):
        raise TypeError(f"factors must be the GDNFactors of tree_closed_form, got {type(factors).__name__}")
    arrays = coerce_inputs(S0=S0, delta=factors.delta, gamma=factors.gamma, k=factors.k, alpha=factors.alpha)
    S0, delta, gamma, k, alpha = (arrays[n] for n in ("S0", "delta", "gamma", "k", "alpha"))
    N = tree.num_nodes
    check_shape("factors.delta", delta, (N, None, None), "N, HV, V")
    HV, V = delta.shape[1:]
    check_shape("factors.gamma", gamma, (N, HV), "N, HV")
    check_shape("factors.alpha", alpha, (N, HV), "N, HV")
    check_shape("factors.k", k, (N, None, None), "N, H, K")
    H, K = k.shape[1:]
    if H == 0 or HV % H != 0:
        raise ValueError(f"factors.delta has HV = {HV} value heads, not a multiple of H = {H} (factors.k)")
    check_shape("S0", S0, (HV, K, V), "HV, K, V")
    group = HV // H
    path = tree.path(node)
    S = _zeros((HV, K, V), S0)
    for h in range(HV):
        acc = _zeros((K, V), S0)
        below = 1  # prod of alpha over the path nodes after j: Gamma_a / Gamma_j
        for j in reversed(path):
            acc = acc + np.outer(k[j, h // group], delta[j, h]) * below
            below = alpha[j, h] * below
        S[h] = acc + S0[h] * below  # below = Gamma_a
    return S


# ======================================================================================================================
# The GDN layer (Qwen3-Next ``linear_attn``) around the core: projections, short convolution on a tree, gates, l2norm,
# gated RMSNorm, output projection. Float64 except the tree-window convolution (``conv_window_index``, ``short_conv``,
# ``conv_state_commit``), which is pure indexing plus products/sums and runs on object arrays too.
# ======================================================================================================================

from dataclasses import dataclass  # noqa: E402

__all__ += [
    "GDNLayerSpec",
    "GDNWeights",
    "GDNLayerCache",
    "GDNTreeRecord",
    "pack_qkvz",
    "unpack_qkvz",
    "pack_ba",
    "unpack_ba",
    "l2norm",
    "silu",
    "gates",
    "gated_rmsnorm",
    "gdn_layer_inputs",
    "conv_window_index",
    "short_conv",
    "conv_state_commit",
    "gdn_layer_chain",
    "gdn_layer_tree",
    "gdn_layer_commit",
]


@dataclass(frozen=True)
class GDNLayerSpec:
    """Sizes and switches of one GDN layer (HF ``Qwen3NextConfig`` names in brackets).

    ``hidden_size`` D, ``num_k_heads`` H [linear_num_key_heads], ``num_v_heads`` HV [linear_num_value_heads],
    ``head_k_dim`` K [linear_key_head_dim], ``head_v_dim`` V [linear_value_head_dim], ``conv_kernel`` W
    [linear_conv_kernel_dim], ``eps`` of the gated RMSNorm [rms_norm_eps], ``allow_neg_eigval``: ``beta = 2 sigmoid(b)``
    instead of ``sigmoid(b)`` (a lumotree extension; HF has no such switch).
    """

    hidden_size: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int = 4
    eps: float = 1e-6
    allow_neg_eigval: bool = False

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "conv_kernel"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GDNLayerSpec.{name} = {value!r} must be a positive integer")
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(
                f"GDNLayerSpec.num_v_heads = {self.num_v_heads} is not a multiple of num_k_heads = {self.num_k_heads}"
            )

    @property
    def group(self) -> int:
        """Value heads per q/k head, ``HV // H``."""
        return self.num_v_heads // self.num_k_heads

    @property
    def key_dim(self) -> int:
        """``H * K``."""
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        """``HV * V``."""
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the short convolution: ``C = 2 H K + HV V`` (q, then k, then v; each head-major)."""
        return 2 * self.key_dim + self.value_dim

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Expected shape of every :class:`GDNWeights` field."""
        D, HV, V = self.hidden_size, self.num_v_heads, self.head_v_dim
        return {
            "in_proj_qkvz": (2 * self.key_dim + 2 * self.value_dim, D),
            "in_proj_ba": (2 * HV, D),
            "conv1d": (self.conv_dim, self.conv_kernel),
            "A_log": (HV,),
            "dt_bias": (HV,),
            "norm": (V,),
            "out_proj": (D, self.value_dim),
        }


@dataclass
class GDNWeights:
    """Weights of one GDN layer, float64, laid out exactly as the HF tensors ``model.layers.{i}.linear_attn.*``.

    - ``in_proj_qkvz: [2HK + 2HV V, D]`` rows grouped per key head g: ``q_g (K), k_g (K), v_g (r V), z_g (r V)`` with
      ``r = HV // H`` (value heads ``g r .. g r + r - 1`` belong to key head g). Build it from plain per-part matrices
      with :func:`pack_qkvz`.
    - ``in_proj_ba: [2 HV, D]`` rows grouped per key head g: ``b_g (r), a_g (r)`` (:func:`pack_ba`).
    - ``conv1d: [C, W]`` depthwise kernel over channels ``q (HK) | k (HK) | v (HV V)``, head-major; column ``W - 1``
      multiplies the current token (HF stores ``[C, 1, W]``).
    - ``A_log, dt_bias: [HV]``; ``norm: [V]`` the gated RMSNorm weight (not zero-centred); ``out_proj: [D, HV V]``.
    """

    in_proj_qkvz: np.ndarray
    in_proj_ba: np.ndarray
    conv1d: np.ndarray
    A_log: np.ndarray
    dt_bias: np.ndarray
    norm: np.ndarray
    out_proj: np.ndarray

    def validate(self, spec: GDNLayerSpec, prefix: str = "GDNWeights") -> None:
        """Raise ``ValueError`` naming the field on a wrong shape or a non-finite entry."""
        validate_weight_fields(self, spec.weight_shapes(), prefix)


@dataclass
class GDNLayerCache:
    """What a GDN layer carries between steps: ``conv_state: [W - 1, C]`` the last W - 1 conv inputs (oldest first,
    zeros before the first token) and ``state: [HV, K, V]`` the recurrent state."""

    conv_state: np.ndarray
    state: np.ndarray

    @classmethod
    def empty(cls, spec: GDNLayerSpec) -> GDNLayerCache:
        return cls(
            conv_state=np.zeros((spec.conv_kernel - 1, spec.conv_dim)),
            state=np.zeros((spec.num_v_heads, spec.head_k_dim, spec.head_v_dim)),
        )

    def copy(self) -> GDNLayerCache:
        return GDNLayerCache(self.conv_state.copy(), self.state.copy())


class GDNTreeRecord(NamedTuple):
    """What a tree pass leaves for the commit: ``conv_inputs: [N, C]`` the pre-convolution inputs of the nodes and
    the core's :class:`GDNFactors`."""

    conv_inputs: np.ndarray
    factors: GDNFactors


def pack_qkvz(w_q, w_k, w_v, w_z, num_k_heads: int) -> np.ndarray:
    """HF ``in_proj_qkvz`` from plain head-major parts ``w_q, w_k: [H K, D]``, ``w_v, w_z: [HV V, D]``."""
    H = num_k_heads
    parts = [np.asarray(w, dtype=np.float64) for w in (w_q, w_k, w_v, w_z)]
    D = parts[0].shape[1]
    grouped = [p.reshape(H, p.shape[0] // H, D) for p in parts]  # each [H, rows per key head, D]
    return np.concatenate(grouped, axis=1).reshape(-1, D)  # [2HK + 2HV V, D]


def unpack_qkvz(in_proj_qkvz: np.ndarray, spec: GDNLayerSpec):
    """Inverse of :func:`pack_qkvz`: ``(w_q [HK, D], w_k [HK, D], w_v [HV V, D], w_z [HV V, D])``."""
    H, K, rV = spec.num_k_heads, spec.head_k_dim, spec.group * spec.head_v_dim
    grouped = in_proj_qkvz.reshape(H, 2 * K + 2 * rV, -1)  # [H, 2K + 2rV, D]
    bounds = np.cumsum([0, K, K, rV, rV])
    return tuple(grouped[:, lo:hi].reshape(-1, grouped.shape[-1]) for lo, hi in zip(bounds[:-1], bounds[1:]))


def pack_ba(w_b, w_a, num_k_heads: int) -> np.ndarray:
    """HF ``in_proj_ba`` from plain ``w_b, w_a: [HV, D]`` (value-head order)."""
    w_b, w_a = np.asarray(w_b, dtype=np.float64), np.asarray(w_a, dtype=np.float64)
    D = w_b.shape[1]
    grouped = [w.reshape(num_k_heads, -1, D) for w in (w_b, w_a)]  # [H, r, D] each
    return np.concatenate(grouped, axis=1).reshape(-1, D)  # [2HV, D]


def unpack_ba(in_proj_ba: np.ndarray, spec: GDNLayerSpec):
    """Inverse of :func:`pack_ba`: ``(w_b [HV, D], w_a [HV, D])``."""
    r = spec.group
    grouped = in_proj_ba.reshape(spec.num_k_heads, 2 * r, -1)  # [H, 2r, D]
    return grouped[:, :r].reshape(-1, grouped.shape[-1]), grouped[:, r:].reshape(-1, grouped.shape[-1])


def l2norm(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """``x * rsqrt(sum x^2 + eps)`` over the last axis (as flash-linear-attention and HF)."""
    return x / np.sqrt((x * x).sum(axis=-1, keepdims=True) + eps)


def silu(x: np.ndarray) -> np.ndarray:
    """``x * sigmoid(x)``, float64."""
    return x * (0.5 * (1.0 + np.tanh(0.5 * x)))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def gates(a: np.ndarray, b: np.ndarray, A_log: np.ndarray, dt_bias: np.ndarray, allow_neg_eigval: bool = False):
    """Decay and write strength from the projections ``a, b: [T, HV]``.

    ``g = -exp(A_log) * softplus(a + dt_bias)``, ``alpha = exp(g)`` in ``(0, 1]``; ``beta = sigmoid(b)``, or
    ``2 sigmoid(b)`` with ``allow_neg_eigval``. Returns ``(alpha [T, HV], beta [T, HV])``.
    """
    g = -np.exp(A_log) * np.logaddexp(0.0, a + dt_bias)  # [T, HV], softplus(x) = log(1 + e^x)
    beta = _sigmoid(b)  # [T, HV]
    return np.exp(g), (2.0 * beta if allow_neg_eigval else beta)


def gated_rmsnorm(o: np.ndarray, z: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """``RMSNormGated(o, z) = weight * o * rsqrt(mean(o^2) + eps) * silu(z)`` over the last axis."""
    return weight * (o / np.sqrt((o * o).mean(axis=-1, keepdims=True) + eps)) * silu(z)


def conv_window_index(tree: TokenTree, kernel: int) -> np.ndarray:
    """Where each node's convolution window comes from: ``[N, W]`` indices into ``concat(conv_state, inputs)``.

    Rows ``0 .. W-2`` of the concatenation are the committed conv state (oldest first), row ``W - 1 + j`` is node j's
    input. Row i lists node i's window oldest first: its ``W - 1`` nearest ancestors, then i itself; past the root the
    window continues into the conv state (the root's parent is the last committed token).
    """
    tree = check_tree(tree)
    if isinstance(kernel, bool) or not isinstance(kernel, int) or kernel < 1:
        raise ValueError(f"kernel = {kernel!r} must be a positive integer")
    N = tree.num_nodes
    index = np.empty((N, kernel), dtype=np.int64)
    for i in range(N):
        lineage = []  # i, parent(i), ... newest first
        node = i
        while node >= 0 and len(lineage) < kernel:
            lineage.append(kernel - 1 + node)
            node = tree.parents[node]
        missing = kernel - len(lineage)  # taken from the conv state's newest rows
        index[i] = list(range(kernel - 1 - missing, kernel - 1)) + lineage[::-1]
    return index


def _conv_sources(inputs, conv_state, tree: TokenTree):
    check_tree(tree)
    arrays = coerce_inputs(inputs=inputs, conv_state=conv_state)
    inputs, conv_state = arrays["inputs"], arrays["conv_state"]
    check_shape("inputs", inputs, (tree.num_nodes, None), "N, C")
    check_shape("conv_state", conv_state, (None, inputs.shape[1]), "W - 1, C")
    for name, a in arrays.items():
        check_finite(name, a)
    return inputs, conv_state


def short_conv(inputs, conv_state, weight, tree: TokenTree) -> np.ndarray:
    """Depthwise causal convolution on a tree, before the activation: ``[N, C]``.

    ``y_i[c] = sum_j weight[c, j] * window_i[j, c]`` with node i's window from :func:`conv_window_index`
    (``inputs: [N, C]``, ``conv_state: [W - 1, C]``, ``weight: [C, W]``). On a chain this is HF's causal conv1d with
    the conv state as left context. Runs on float64 and object arrays (array on the left of every product).
    """
    inputs, conv_state = _conv_sources(inputs, conv_state, tree)
    weight = coerce_inputs(weight=weight, like=inputs)["weight"]
    C = inputs.shape[1]
    kernel = conv_state.shape[0] + 1
    check_shape("weight", weight, (C, kernel), "C, W")
    check_finite("weight", weight)
    sources = np.concatenate([conv_state, inputs], axis=0)  # [W - 1 + N, C]
    windows = sources[conv_window_index(tree, kernel)]  # [N, W, C]
    out = windows[:, 0, :] * weight[:, 0]  # [N, C]
    for j in range(1, kernel):
        out = out + windows[:, j, :] * weight[:, j]
    return out


def conv_state_commit(inputs, conv_state, tree: TokenTree, node: int) -> np.ndarray:
    """The conv state after accepting ``node``: the last ``W - 1`` inputs along the path to it, ``[W - 1, C]``
    (continuing into the old conv state when the path is shorter). Runs on float64 and object arrays."""
    inputs, conv_state = _conv_sources(inputs, conv_state, tree)
    kernel = conv_state.shape[0] + 1
    node = tree.path(node)[-1]
    sources = np.concatenate([conv_state, inputs], axis=0)  # [W - 1 + N, C]
    return sources[conv_window_index(tree, kernel)[node, 1:]].copy()


def gdn_layer_inputs(x: np.ndarray, weights: GDNWeights, spec: GDNLayerSpec, conv_state: np.ndarray, tree: TokenTree):
    """Projections, tree convolution + SiLU, split, l2norm and gates for the tokens ``x: [N, D]`` laid on ``tree``.

    Returns ``(conv_inputs [N, C], q [N, H, K], k [N, H, K], v [N, HV, V], z [N, HV, V], alpha [N, HV],
    beta [N, HV])``: everything the core and the output gate need (q and k l2-normalised, q not yet scaled).
    """
    tree = check_tree(tree)
    x = np.asarray(x, dtype=np.float64)
    check_shape("x", x, (tree.num_nodes, spec.hidden_size), "N, D")
    check_finite("x", x)
    N = x.shape[0]
    H, HV, K, V, r = spec.num_k_heads, spec.num_v_heads, spec.head_k_dim, spec.head_v_dim, spec.group
    qkvz = (x @ weights.in_proj_qkvz.T).reshape(N, H, 2 * K + 2 * r * V)  # [N, H, 2K + 2rV]
    ba = (x @ weights.in_proj_ba.T).reshape(N, H, 2 * r)  # [N, H, 2r]
    conv_inputs = np.concatenate(
        [qkvz[:, :, :K].reshape(N, H * K), qkvz[:, :, K : 2 * K].reshape(N, H * K),
         qkvz[:, :, 2 * K : 2 * K + r * V].reshape(N, HV * V)],
        axis=1,
    )  # [N, C]
    z = qkvz[:, :, 2 * K + r * V :].reshape(N, HV, V)  # [N, HV, V]
    b = ba[:, :, :r].reshape(N, HV)  # [N, HV]
    a = ba[:, :, r:].reshape(N, HV)  # [N, HV]
    mixed = silu(short_conv(conv_inputs, conv_state, weights.conv1d, tree))  # [N, C]
    q = l2norm(mixed[:, : H * K].reshape(N, H, K))  # [N, H, K]
    k = l2norm(mixed[:, H * K : 2 * H * K].reshape(N, H, K))  # [N, H, K]
    v = mixed[:, 2 * H * K :].reshape(N, HV, V)  # [N, HV, V]
    alpha, beta = gates(a, b, weights.A_log, weights.dt_bias, spec.allow_neg_eigval)  # [N, HV] each
    return conv_inputs, q, k, v, z, alpha, beta


_gdn_layer_inputs = gdn_layer_inputs  # older private name, still used by lumotree.expressivity


def _gdn_layer_output(o: np.ndarray, z: np.ndarray, weights: GDNWeights, spec: GDNLayerSpec) -> np.ndarray:
    normed = gated_rmsnorm(o, z, weights.norm, spec.eps)  # [N, HV, V]
    return normed.reshape(o.shape[0], spec.value_dim) @ weights.out_proj.T  # [N, D]


def gdn_layer_chain(x, weights: GDNWeights, spec: GDNLayerSpec, cache: GDNLayerCache):
    """The layer over T tokens in order (prefill, or decode when T = 1), by the recurrence (:func:`chain`).

    ``x: [T, D]`` (the normed hidden states). Returns ``(out [T, D], new GDNLayerCache)``; ``cache`` is not modified.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"x has shape {x.shape}, expected [T, D] with T >= 1")
    path = TokenTree.chain(x.shape[0])
    conv_inputs, q, k, v, z, alpha, beta = gdn_layer_inputs(x, weights, spec, cache.conv_state, path)
    o, state = chain(q, k, v, alpha, beta, cache.state, spec.head_k_dim**-0.5)  # [T, HV, V], [HV, K, V]
    conv_state = conv_state_commit(conv_inputs, cache.conv_state, path, path.num_nodes - 1)  # [W - 1, C]
    return _gdn_layer_output(o, z, weights, spec), GDNLayerCache(conv_state=conv_state, state=state)


def gdn_layer_tree(x, weights: GDNWeights, spec: GDNLayerSpec, cache: GDNLayerCache, tree: TokenTree):
    """The layer on every node of a draft tree at once (:func:`tree_closed_form`), without touching the cache.

    ``x: [N, D]`` (normed hidden states of the nodes). Returns ``(out [N, D], GDNTreeRecord)``; the record is what
    :func:`gdn_layer_commit` needs to advance the cache to an accepted node.
    """
    conv_inputs, q, k, v, z, alpha, beta = gdn_layer_inputs(x, weights, spec, cache.conv_state, tree)
    o, factors = tree_closed_form(q, k, v, alpha, beta, cache.state, tree, spec.head_k_dim**-0.5)  # o: [N, HV, V]
    return _gdn_layer_output(o, z, weights, spec), GDNTreeRecord(conv_inputs=conv_inputs, factors=factors)


def gdn_layer_commit(record: GDNTreeRecord, cache: GDNLayerCache, tree: TokenTree, node: int) -> GDNLayerCache:
    """The layer cache after accepting ``node``: state rebuilt from factors (:func:`commit`), conv state from the path
    inputs (:func:`conv_state_commit`). ``cache`` is not modified."""
    return GDNLayerCache(
        conv_state=conv_state_commit(record.conv_inputs, cache.conv_state, tree, node),
        state=commit(cache.state, record.factors, tree, node),
    )
