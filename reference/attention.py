r"""Gated attention (Qwen3-Next ``self_attn``), exact in float64, with a KV cache and tree verification.

Per token (HF ``Qwen3NextAttention``)::

    [query_h | gate_h] = (x W_q^T)[h]              q_proj rows interleaved per head: head_dim query, head_dim gate
    q = rope(rmsnorm0(query) ; pos),  k = rope(rmsnorm0(x W_k^T) ; pos),  v = x W_v^T
    o_h = softmax_j(scale q_h . k_{g(h), j}) v_{g(h), j}     over allowed j,  g(h) = h // (Hq // Hkv)   (GQA)
    out = (o * sigmoid(gate)) W_o^T

``rmsnorm0(x) = x * rsqrt(mean(x^2) + eps) * (1 + w)`` (zero-centred weight); RoPE rotates the first
``rotary_dim = head_dim * partial_rotary_factor`` channels with HF's ``rotate_half`` convention (pairs
``(c, c + rd/2)``), ``inv_freq_m = theta^(-2m / rd)``. Keys are cached after norm and RoPE.

On a tree node i sits at position ``prefix_len + depth(i)`` and attends to the whole cache plus its
ancestors (inclusive ancestor mask). Committing node a appends the K/V of the path root..a to the cache in path
order (positions ``prefix_len ..``); the other nodes' K/V are dropped. A prefill or decode step is the same code on a
chain tree.

The core (:func:`apply_rope`, :func:`tree_attention_core`, :func:`kv_commit`) runs on float64 arrays and, given an
``exp`` for the element type, on object arrays (arrays on the left of every product).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from .numerics import check_finite, check_scale, check_shape, coerce_inputs, validate_weight_fields
from .tree import TokenTree, check_tree, node_position, tree_slot

__all__ = [
    "AttentionSpec",
    "AttentionWeights",
    "KVCache",
    "AttentionTreeRecord",
    "pack_query_gate",
    "unpack_query_gate",
    "zero_centred_rmsnorm",
    "rope_cos_sin",
    "apply_rope",
    "tree_attention_core",
    "kv_commit",
    "attention_layer_tree",
    "attention_layer_chain",
    "attention_layer_commit",
]


@dataclass(frozen=True)
class AttentionSpec:
    """Sizes of one gated-attention layer (HF names in brackets).

    ``hidden_size`` D, ``num_heads`` Hq [num_attention_heads], ``num_kv_heads`` Hkv [num_key_value_heads],
    ``head_dim`` Dh, ``rotary_dim`` = ``int(head_dim * partial_rotary_factor)`` (even), ``rope_theta``,
    ``eps`` [rms_norm_eps] of the q/k norms.
    """

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int
    rope_theta: float = 10000.0
    eps: float = 1e-6

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_heads", "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"AttentionSpec.{name} = {value!r} must be a positive integer")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"AttentionSpec.num_heads = {self.num_heads} is not a multiple of num_kv_heads = {self.num_kv_heads}"
            )
        if not 0 <= self.rotary_dim <= self.head_dim or self.rotary_dim % 2:
            raise ValueError(f"AttentionSpec.rotary_dim = {self.rotary_dim} must be even and in [0, head_dim]")
        if not self.rope_theta > 0:
            raise ValueError(f"AttentionSpec.rope_theta = {self.rope_theta} must be positive")

    @property
    def scale(self) -> float:
        """``head_dim ** -0.5``."""
        return float(self.head_dim) ** -0.5

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Expected shape of every :class:`AttentionWeights` field."""
        D, Hq, Hkv, Dh = self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim
        return {
            "q_proj": (2 * Hq * Dh, D),
            "k_proj": (Hkv * Dh, D),
            "v_proj": (Hkv * Dh, D),
            "o_proj": (D, Hq * Dh),
            "q_norm": (Dh,),
            "k_norm": (Dh,),
        }


@dataclass
class AttentionWeights:
    """Weights of one attention layer, float64, laid out exactly as HF ``model.layers.{i}.self_attn.*``.

    ``q_proj: [2 Hq Dh, D]`` rows per head h: ``Dh`` query rows then ``Dh`` gate rows (:func:`pack_query_gate`);
    ``k_proj, v_proj: [Hkv Dh, D]``; ``o_proj: [D, Hq Dh]``; ``q_norm, k_norm: [Dh]`` zero-centred norm weights
    (the scale is ``1 + w``). No biases (HF ``attention_bias = False``).
    """

    q_proj: np.ndarray
    k_proj: np.ndarray
    v_proj: np.ndarray
    o_proj: np.ndarray
    q_norm: np.ndarray
    k_norm: np.ndarray

    def validate(self, spec: AttentionSpec, prefix: str = "AttentionWeights") -> None:
        """Raise ``ValueError`` naming the field on a wrong shape or a non-finite entry."""
        validate_weight_fields(self, spec.weight_shapes(), prefix)


@dataclass
class KVCache:
    """Keys (after norm and RoPE) and values of the committed tokens: ``keys, values: [L, Hkv, Dh]``, position order."""

    keys: np.ndarray
    values: np.ndarray

    @classmethod
    def empty(cls, spec: AttentionSpec) -> KVCache:
        return cls(np.zeros((0, spec.num_kv_heads, spec.head_dim)), np.zeros((0, spec.num_kv_heads, spec.head_dim)))

    @property
    def length(self) -> int:
        return int(self.keys.shape[0])

    def copy(self) -> KVCache:
        return KVCache(self.keys.copy(), self.values.copy())


class AttentionTreeRecord(NamedTuple):
    """What a tree pass leaves for the commit: the nodes' ``keys, values: [N, Hkv, Dh]`` (keys after norm and RoPE)."""

    keys: np.ndarray
    values: np.ndarray


def pack_query_gate(w_query, w_gate, num_heads: int) -> np.ndarray:
    """HF ``q_proj`` from plain head-major ``w_query, w_gate: [Hq Dh, D]``: rows per head ``query_h, gate_h``."""
    w_query, w_gate = np.asarray(w_query, dtype=np.float64), np.asarray(w_gate, dtype=np.float64)
    D = w_query.shape[1]
    grouped = [w.reshape(num_heads, -1, D) for w in (w_query, w_gate)]  # [Hq, Dh, D] each
    return np.concatenate(grouped, axis=1).reshape(-1, D)  # [2 Hq Dh, D]


def unpack_query_gate(q_proj: np.ndarray, num_heads: int):
    """Inverse of :func:`pack_query_gate`: ``(w_query [Hq Dh, D], w_gate [Hq Dh, D])``."""
    grouped = q_proj.reshape(num_heads, 2, -1, q_proj.shape[-1])  # [Hq, 2, Dh, D]
    return grouped[:, 0].reshape(-1, q_proj.shape[-1]), grouped[:, 1].reshape(-1, q_proj.shape[-1])


def zero_centred_rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """``x * rsqrt(mean(x^2) + eps) * (1 + weight)`` over the last axis (float64)."""
    return (x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)) * (1.0 + weight)


def rope_cos_sin(positions, rotary_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """``cos, sin: [T, rotary_dim]`` for integer ``positions: [T]``: angle ``pos * theta^(-2m / rd)`` at channels
    ``m`` and ``m + rd/2`` (HF duplicates the frequencies: ``emb = cat(freqs, freqs)``)."""
    positions = np.asarray(positions)
    if positions.ndim != 1 or positions.dtype.kind not in "iu" or (positions < 0).any():
        raise ValueError(f"positions must be a 1-D array of non-negative integers, got {positions!r}")
    inv_freq = float(theta) ** -(np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)  # [rd / 2]
    freqs = positions.astype(np.float64)[:, None] * inv_freq[None, :]  # [T, rd / 2]
    angles = np.concatenate([freqs, freqs], axis=-1)  # [T, rd]
    return np.cos(angles), np.sin(angles)


def apply_rope(x, cos, sin) -> np.ndarray:
    """Rotate the first ``rd`` channels of ``x: [T, heads, Dh]`` with ``cos, sin: [T, rd]``; the rest pass through.

    ``x_rot * cos + rotate_half(x_rot) * sin`` with ``rotate_half(u) = cat(-u[rd/2:], u[:rd/2])``. Generic over
    object arrays (pass exact ``cos, sin``).
    """
    x = np.asarray(x)
    rd = np.asarray(cos).shape[-1]
    check_shape("cos", np.asarray(cos), (x.shape[0], rd), "T, rd")
    check_shape("sin", np.asarray(sin), (x.shape[0], rd), "T, rd")
    x_rot, x_pass = x[..., :rd], x[..., rd:]  # [T, heads, rd], [T, heads, Dh - rd]
    rotated = np.concatenate([-x_rot[..., rd // 2 :], x_rot[..., : rd // 2]], axis=-1)  # [T, heads, rd]
    out = x_rot * np.asarray(cos)[:, None, :] + rotated * np.asarray(sin)[:, None, :]
    return np.concatenate([out, x_pass], axis=-1)


def tree_attention_core(
    q, k_cache, v_cache, k_tree, v_tree, tree: TokenTree, scale: Any, exp: Callable[[Any], Any] | None = None
) -> np.ndarray:
    """Softmax attention of every tree node over the cache and its ancestors (itself included).

    Shapes: ``q: [N, Hq, Dh]``, ``k_cache, v_cache: [L, Hkv, Dh]``, ``k_tree, v_tree: [N, Hkv, Dh]``; returns
    ``o: [N, Hq, Dh]``. Query head h reads kv head ``h // (Hq // Hkv)``. For node i, with allowed set
    ``A_i = {cache 0..L-1} + {j : M[i, j] = 1}``: ``o_i = sum_{j in A_i} e_ij v_j / sum_{j in A_i} e_ij``,
    ``e_ij = exp(scale * q_i . k_j)``. Float64 subtracts the row maximum first (the ratio is unchanged); object
    arrays need ``exp`` for their element type (e.g. ``sympy.exp``) and skip the shift.
    """
    tree = check_tree(tree)
    arrays = coerce_inputs(q=q, k_cache=k_cache, v_cache=v_cache, k_tree=k_tree, v_tree=v_tree)
    q, k_cache, v_cache, k_tree, v_tree = (arrays[n] for n in ("q", "k_cache", "v_cache", "k_tree", "v_tree"))
    N = tree.num_nodes
    check_shape("q", q, (N, None, None), "N, Hq, Dh")
    Hq, Dh = q.shape[1:]
    check_shape("k_tree", k_tree, (N, None, Dh), "N, Hkv, Dh")
    Hkv = k_tree.shape[1]
    if Hq % Hkv:
        raise ValueError(f"q has Hq = {Hq} heads, not a multiple of Hkv = {Hkv} (k_tree)")
    check_shape("v_tree", v_tree, (N, Hkv, Dh), "N, Hkv, Dh")
    check_shape("k_cache", k_cache, (None, Hkv, Dh), "L, Hkv, Dh")
    check_shape("v_cache", v_cache, k_cache.shape, "L, Hkv, Dh")
    for name, a in arrays.items():
        check_finite(name, a)
    exact = q.dtype == object
    check_scale(scale, exact)
    if exact and exp is None:
        raise TypeError("tree_attention_core on object arrays needs exp= for the element type (e.g. sympy.exp)")
    L = k_cache.shape[0]
    group = Hq // Hkv
    keys = np.concatenate([k_cache, k_tree], axis=0)  # [L + N, Hkv, Dh]
    values = np.concatenate([v_cache, v_tree], axis=0)  # [L + N, Hkv, Dh]
    allowed = np.concatenate([np.ones((N, L), dtype=bool), tree.ancestor_mask], axis=1)  # [N, L + N]
    o = np.empty((N, Hq, Dh), dtype=q.dtype)
    for h in range(Hq):
        scores = (q[:, h] @ keys[:, h // group].T) * scale  # [N, L + N]
        for i in range(N):
            cols = np.flatnonzero(allowed[i])  # cache + ancestors of i
            row = scores[i, cols]  # [n_i]
            if exact:
                weights = np.array([exp(s) for s in row], dtype=object)  # [n_i]
            else:
                weights = np.exp(row - row.max())  # [n_i]
            o[i, h] = (weights @ values[cols, h // group]) / weights.sum()
    return o


def kv_commit(k_cache, v_cache, k_tree, v_tree, tree: TokenTree, node: int) -> tuple[np.ndarray, np.ndarray]:
    """Compaction after accepting ``node``: the cache followed by the tree K/V of the path root..node in path order,
    ``([L + depth(node) + 1, Hkv, Dh], same)``. Rejected nodes are dropped.

    Done as the kernels do it, in place behind the cache: the tree pass left node j at slot
    :func:`~lumotree.reference.tree.tree_slot` ``(L, j)``; in path order each path node moves to
    :func:`~lumotree.reference.tree.node_position` ``(L, depth(j))``, then the cache ends after the accepted node.
    """
    tree = check_tree(tree)
    path = tree.path(node)
    depth = tree.depth
    length = np.asarray(k_cache).shape[0]
    keys = np.concatenate([np.asarray(k_cache), np.asarray(k_tree)], axis=0)  # [L + N, Hkv, Dh] slots
    values = np.concatenate([np.asarray(v_cache), np.asarray(v_tree)], axis=0)
    for j in path:  # root first: a move never overwrites a slot still to be read (position <= slot)
        source, destination = tree_slot(length, j), node_position(length, int(depth[j]))
        keys[destination] = keys[source]
        values[destination] = values[source]
    end = node_position(length, int(depth[path[-1]])) + 1
    return keys[:end].copy(), values[:end].copy()


def _project(x: np.ndarray, weights: AttentionWeights, spec: AttentionSpec, positions: np.ndarray):
    """Queries, gates, keys and values of tokens ``x: [N, D]`` at ``positions: [N]``."""
    x = np.asarray(x, dtype=np.float64)
    check_shape("x", x, (positions.shape[0], spec.hidden_size), "N, D")
    check_finite("x", x)
    N, Hq, Hkv, Dh = x.shape[0], spec.num_heads, spec.num_kv_heads, spec.head_dim
    query_gate = (x @ weights.q_proj.T).reshape(N, Hq, 2 * Dh)  # [N, Hq, 2 Dh]
    query = zero_centred_rmsnorm(query_gate[:, :, :Dh], weights.q_norm, spec.eps)  # [N, Hq, Dh]
    gate = query_gate[:, :, Dh:].reshape(N, Hq * Dh)  # [N, Hq Dh]
    key = zero_centred_rmsnorm((x @ weights.k_proj.T).reshape(N, Hkv, Dh), weights.k_norm, spec.eps)  # [N, Hkv, Dh]
    value = (x @ weights.v_proj.T).reshape(N, Hkv, Dh)  # [N, Hkv, Dh]
    cos, sin = rope_cos_sin(positions, spec.rotary_dim, spec.rope_theta)  # [N, rd] each
    return apply_rope(query, cos, sin), gate, apply_rope(key, cos, sin), value


def attention_layer_tree(x, weights: AttentionWeights, spec: AttentionSpec, cache: KVCache, tree: TokenTree):
    """The layer on every node of a tree (node i at position ``cache.length + depth(i)``), cache untouched.

    ``x: [N, D]`` normed hidden states. Returns ``(out [N, D], AttentionTreeRecord)``.
    """
    tree = check_tree(tree)
    positions = node_position(cache.length, tree.depth)  # [N]
    query, gate, key, value = _project(x, weights, spec, positions)
    o = tree_attention_core(query, cache.keys, cache.values, key, value, tree, spec.scale)  # [N, Hq, Dh]
    gated = o.reshape(o.shape[0], -1) * (0.5 * (1.0 + np.tanh(0.5 * gate)))  # [N, Hq Dh], o * sigmoid(gate)
    return gated @ weights.o_proj.T, AttentionTreeRecord(keys=key, values=value)


def attention_layer_commit(record: AttentionTreeRecord, cache: KVCache, tree: TokenTree, node: int) -> KVCache:
    """The cache after accepting ``node`` (:func:`kv_commit`); ``cache`` is not modified."""
    keys, values = kv_commit(cache.keys, cache.values, record.keys, record.values, tree, node)
    return KVCache(keys, values)


def attention_layer_chain(x, weights: AttentionWeights, spec: AttentionSpec, cache: KVCache):
    """The layer over T tokens in order (prefill, or decode when T = 1): the tree pass on a chain, then its commit.

    Returns ``(out [T, D], new KVCache)``; ``cache`` is not modified.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"x has shape {x.shape}, expected [T, D] with T >= 1")
    path = TokenTree.chain(x.shape[0])
    out, record = attention_layer_tree(x, weights, spec, cache, path)
    return out, attention_layer_commit(record, cache, path, path.num_nodes - 1)
