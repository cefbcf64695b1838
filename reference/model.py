r"""The hybrid model (Qwen3-Next layout), exact in float64: prefill, decode, tree verify, commit, HF checkpoints.

Layer i is ``config.layer_types[i]``: ``"full_attention"`` (gated attention, :mod:`~lumotree.reference.attention`)
or ``"linear_attention"`` (GDN, :mod:`~lumotree.reference.gdn`). Every block is::

    h = h + mixer(rmsnorm0(h; input_layernorm))
    h = h + mlp(rmsnorm0(h; post_attention_layernorm))
    logits = rmsnorm0(h; norm) @ lm_head^T          (lm_head = embed_tokens when tie_word_embeddings)

with ``rmsnorm0(x; w) = x * rsqrt(mean(x^2) + eps) * (1 + w)``. The MLP is a dense SwiGLU
``down(silu(gate x) * up x)`` or the MoE block: router ``p = softmax(W_r x)``, the top-k experts by ``p`` weighted by
``p`` (renormalised to sum 1 when ``norm_topk_prob``), plus ``sigmoid(w_s . x) * shared_expert(x)``.

API (others rely on these names): ``model.new_cache()``; ``model.forward(token_ids, cache)`` -> logits ``[T, vocab]``
and advances the cache; ``model.verify_tree(tokens, tree, cache)`` -> logits ``[N, vocab]`` of every node, cache
untouched; ``model.commit(tokens, tree, node, cache)`` advances every layer cache along the path to ``node``
(GDN states from the factors, conv states from the path inputs, KV compaction). ``load_pretrained(path)``,
``save_pretrained(model, path)`` read and write HF ``Qwen3NextForCausalLM`` checkpoints; ``build_random(config,
seed)`` makes a seeded model.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from numbers import Integral
from typing import NamedTuple, Union

import numpy as np

from . import attention, gdn
from .attention import AttentionTreeRecord, AttentionWeights, KVCache, zero_centred_rmsnorm
from .checkpoint import read_config, read_tensors, write_checkpoint
from .config import HybridConfig
from .gdn import GDNLayerCache, GDNTreeRecord, GDNWeights, silu
from .numerics import check_finite, check_shape
from .tree import TokenTree

__all__ = [
    "HybridConfig",
    "MLPWeights",
    "MoEWeights",
    "DecoderLayerWeights",
    "ModelWeights",
    "HybridCache",
    "TreePass",
    "HybridModel",
    "mlp",
    "moe",
    "build_random",
    "load_pretrained",
    "save_pretrained",
    "hf_tensor_shapes",
    "weights_to_tensors",
    "weights_from_tensors",
    "IGNORED_TENSOR_PREFIXES",
]

#: Checkpoint tensors ignored on load: Qwen3-Next's multi-token-prediction head (HF ignores it too).
IGNORED_TENSOR_PREFIXES = ("mtp.",)


# ====================================================================================================== weights
@dataclass
class MLPWeights:
    """Dense SwiGLU: ``gate_proj, up_proj: [I, D]``, ``down_proj: [D, I]`` (HF ``mlp.*`` / ``shared_expert.*``)."""

    gate_proj: np.ndarray
    up_proj: np.ndarray
    down_proj: np.ndarray


@dataclass
class MoEWeights:
    """MoE block: ``router: [E, D]`` (HF ``mlp.gate``), experts stacked ``gate_proj, up_proj: [E, I, D]``,
    ``down_proj: [E, D, I]`` (HF ``mlp.experts.{e}.*``), ``shared_expert: MLPWeights``,
    ``shared_expert_gate: [1, D]``."""

    router: np.ndarray
    gate_proj: np.ndarray
    up_proj: np.ndarray
    down_proj: np.ndarray
    shared_expert: MLPWeights
    shared_expert_gate: np.ndarray


@dataclass
class DecoderLayerWeights:
    """One block: ``input_layernorm, post_attention_layernorm: [D]`` (zero-centred), the mixer
    (:class:`~lumotree.reference.gdn.GDNWeights` or :class:`~lumotree.reference.attention.AttentionWeights`) and
    the MLP (:class:`MLPWeights` or :class:`MoEWeights`)."""

    input_layernorm: np.ndarray
    mixer: Union[GDNWeights, AttentionWeights]
    post_attention_layernorm: np.ndarray
    mlp: Union[MLPWeights, MoEWeights]


@dataclass
class ModelWeights:
    """All weights, float64: ``embed_tokens: [vocab, D]``, ``layers``, final ``norm: [D]`` (zero-centred),
    ``lm_head: [vocab, D]`` (None: the embedding is used, as ``tie_word_embeddings`` asks; a tied checkpoint that
    stores a different head keeps it, as transformers does)."""

    embed_tokens: np.ndarray
    layers: list[DecoderLayerWeights]
    norm: np.ndarray
    lm_head: np.ndarray | None


def _layer_prefix(i: int) -> str:
    return f"model.layers.{i}"


def _mlp_shapes(prefix: str, D: int, inner: int) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.gate_proj.weight": (inner, D), f"{prefix}.up_proj.weight": (inner, D),
            f"{prefix}.down_proj.weight": (D, inner)}


def hf_tensor_shapes(config: HybridConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of a HF ``Qwen3NextForCausalLM`` checkpoint of this config, with its HF shape."""
    D = config.hidden_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, D),
                                          "model.norm.weight": (D,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, D)
    for i, kind in enumerate(config.layer_types):
        p = _layer_prefix(i)
        shapes[f"{p}.input_layernorm.weight"] = (D,)
        shapes[f"{p}.post_attention_layernorm.weight"] = (D,)
        if kind == "linear_attention":
            spec = config.gdn_spec()
            for name, shape in spec.weight_shapes().items():
                if name == "conv1d":
                    shape = (shape[0], 1, shape[1])
                suffix = "" if name in ("A_log", "dt_bias") else ".weight"
                shapes[f"{p}.linear_attn.{name}{suffix}"] = shape
        else:
            for name, shape in config.attention_spec().weight_shapes().items():
                shapes[f"{p}.self_attn.{name}.weight"] = shape
        if config.is_moe_layer(i):
            shapes[f"{p}.mlp.gate.weight"] = (config.num_experts, D)
            for e in range(config.num_experts):
                shapes.update(_mlp_shapes(f"{p}.mlp.experts.{e}", D, config.moe_intermediate_size))
            shapes.update(_mlp_shapes(f"{p}.mlp.shared_expert", D, config.shared_expert_intermediate_size))
            shapes[f"{p}.mlp.shared_expert_gate.weight"] = (1, D)
        else:
            shapes.update(_mlp_shapes(f"{p}.mlp", D, config.intermediate_size))
    return shapes


def weights_to_tensors(weights: ModelWeights, config: HybridConfig) -> dict[str, np.ndarray]:
    """HF tensor name -> array (HF shapes) for every weight."""
    asarray = np.asarray
    out = {"model.embed_tokens.weight": weights.embed_tokens, "model.norm.weight": weights.norm}
    if weights.lm_head is not None:
        out["lm_head.weight"] = weights.lm_head
    for i, layer in enumerate(weights.layers):
        p = _layer_prefix(i)
        out[f"{p}.input_layernorm.weight"] = layer.input_layernorm
        out[f"{p}.post_attention_layernorm.weight"] = layer.post_attention_layernorm
        mixer = layer.mixer
        if isinstance(mixer, GDNWeights):
            for name in ("in_proj_qkvz", "in_proj_ba", "norm", "out_proj"):
                out[f"{p}.linear_attn.{name}.weight"] = getattr(mixer, name)
            out[f"{p}.linear_attn.conv1d.weight"] = asarray(mixer.conv1d)[:, None, :]
            out[f"{p}.linear_attn.A_log"] = mixer.A_log
            out[f"{p}.linear_attn.dt_bias"] = mixer.dt_bias
        else:
            for name in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
                out[f"{p}.self_attn.{name}.weight"] = getattr(mixer, name)
        block = layer.mlp
        if isinstance(block, MoEWeights):
            out[f"{p}.mlp.gate.weight"] = block.router
            for e in range(asarray(block.router).shape[0]):
                for name in ("gate_proj", "up_proj", "down_proj"):
                    out[f"{p}.mlp.experts.{e}.{name}.weight"] = asarray(getattr(block, name))[e]
            for name in ("gate_proj", "up_proj", "down_proj"):
                out[f"{p}.mlp.shared_expert.{name}.weight"] = getattr(block.shared_expert, name)
            out[f"{p}.mlp.shared_expert_gate.weight"] = block.shared_expert_gate
        else:
            for name in ("gate_proj", "up_proj", "down_proj"):
                out[f"{p}.mlp.{name}.weight"] = getattr(block, name)
    return out


def weights_from_tensors(tensors: dict[str, np.ndarray], config: HybridConfig) -> ModelWeights:
    """Build :class:`ModelWeights` from HF-named tensors. A missing tensor, a wrong shape, a non-finite entry or an
    unexpected tensor raises ``ValueError`` naming the tensor. With tied embeddings a stored ``lm_head.weight`` that
    differs from the embedding is kept as the head (what transformers does, with a warning)."""
    expected = hf_tensor_shapes(config)
    for name in sorted(tensors):
        if name in expected or name.startswith(IGNORED_TENSOR_PREFIXES):
            continue
        if name == "lm_head.weight" and config.tie_word_embeddings:
            head = np.asarray(tensors[name], dtype=np.float64)
            if head.shape != (config.vocab_size, config.hidden_size):
                raise ValueError(f"tensor 'lm_head.weight' has shape {list(head.shape)}, expected "
                                 f"{[config.vocab_size, config.hidden_size]}")
            check_finite("tensor 'lm_head.weight'", head)
            continue
        raise ValueError(f"unexpected tensor {name!r} in the checkpoint (not part of this config's model)")
    for name, shape in expected.items():
        if name not in tensors:
            raise ValueError(f"checkpoint is missing tensor {name!r} (expected shape {list(shape)})")
        t = np.asarray(tensors[name], dtype=np.float64)
        if t.shape != shape:
            raise ValueError(f"tensor {name!r} has shape {list(t.shape)}, expected {list(shape)}")
        check_finite(f"tensor {name!r}", t)

    def get(name: str) -> np.ndarray:
        return np.asarray(tensors[name], dtype=np.float64)

    def dense(prefix: str) -> MLPWeights:
        return MLPWeights(*(get(f"{prefix}.{n}.weight") for n in ("gate_proj", "up_proj", "down_proj")))

    layers = []
    for i, kind in enumerate(config.layer_types):
        p = _layer_prefix(i)
        mixer: GDNWeights | AttentionWeights
        if kind == "linear_attention":
            a = f"{p}.linear_attn"
            mixer = GDNWeights(
                in_proj_qkvz=get(f"{a}.in_proj_qkvz.weight"), in_proj_ba=get(f"{a}.in_proj_ba.weight"),
                conv1d=get(f"{a}.conv1d.weight")[:, 0, :], A_log=get(f"{a}.A_log"), dt_bias=get(f"{a}.dt_bias"),
                norm=get(f"{a}.norm.weight"), out_proj=get(f"{a}.out_proj.weight"),
            )
        else:
            mixer = AttentionWeights(*(get(f"{p}.self_attn.{n}.weight")
                                       for n in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")))
        block: MLPWeights | MoEWeights
        if config.is_moe_layer(i):
            experts = range(config.num_experts)
            block = MoEWeights(
                router=get(f"{p}.mlp.gate.weight"),
                gate_proj=np.stack([get(f"{p}.mlp.experts.{e}.gate_proj.weight") for e in experts]),
                up_proj=np.stack([get(f"{p}.mlp.experts.{e}.up_proj.weight") for e in experts]),
                down_proj=np.stack([get(f"{p}.mlp.experts.{e}.down_proj.weight") for e in experts]),
                shared_expert=dense(f"{p}.mlp.shared_expert"),
                shared_expert_gate=get(f"{p}.mlp.shared_expert_gate.weight"),
            )
        else:
            block = dense(f"{p}.mlp")
        layers.append(DecoderLayerWeights(get(f"{p}.input_layernorm.weight"), mixer,
                                          get(f"{p}.post_attention_layernorm.weight"), block))
    lm_head = get("lm_head.weight") if "lm_head.weight" in tensors else None  # tied: a stored head is kept
    if lm_head is not None and config.tie_word_embeddings and np.array_equal(lm_head, get("model.embed_tokens.weight")):
        lm_head = None
    return ModelWeights(get("model.embed_tokens.weight"), layers, get("model.norm.weight"), lm_head)


def _validated_weights(weights: ModelWeights, config: HybridConfig) -> ModelWeights:
    """Hand-built weights checked (shapes, finiteness; errors name the HF tensor) and copied to float64 arrays."""
    if len(weights.layers) != config.num_hidden_layers:
        raise ValueError(f"weights.layers has {len(weights.layers)} layers, config says {config.num_hidden_layers}")
    if not config.tie_word_embeddings and weights.lm_head is None:
        raise ValueError("weights.lm_head is None but config.tie_word_embeddings is false")
    for i, (kind, layer) in enumerate(zip(config.layer_types, weights.layers)):
        want_mixer = GDNWeights if kind == "linear_attention" else AttentionWeights
        want_mlp = MoEWeights if config.is_moe_layer(i) else MLPWeights
        if not isinstance(layer.mixer, want_mixer):
            raise ValueError(f"weights.layers[{i}].mixer is {type(layer.mixer).__name__}; {kind} needs "
                             f"{want_mixer.__name__}")
        if not isinstance(layer.mlp, want_mlp):
            raise ValueError(f"weights.layers[{i}].mlp is {type(layer.mlp).__name__}; layer {i} needs "
                             f"{want_mlp.__name__}")
    # one source of truth for names and shapes: the HF mapping
    return weights_from_tensors(weights_to_tensors(weights, config), config)


# ====================================================================================================== blocks
def mlp(x: np.ndarray, w: MLPWeights) -> np.ndarray:
    """Dense SwiGLU ``down(silu(gate x) * up x)`` on ``x: [T, D]``."""
    return (silu(x @ w.gate_proj.T) * (x @ w.up_proj.T)) @ w.down_proj.T  # [T, D]


def moe(x: np.ndarray, w: MoEWeights, top_k: int, norm_topk_prob: bool) -> np.ndarray:
    """MoE block on ``x: [T, D]``: softmax router, top-k experts (renormalised when ``norm_topk_prob``), plus the
    sigmoid-gated shared expert. Ties in the router order the lower expert index first."""
    logits = x @ w.router.T  # [T, E]
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs = probs / probs.sum(axis=-1, keepdims=True)  # [T, E]
    out = np.zeros_like(x)  # [T, D]
    for t in range(x.shape[0]):
        chosen = np.argsort(-probs[t], kind="stable")[:top_k]  # [k]
        weights = probs[t, chosen]  # [k]
        if norm_topk_prob:
            weights = weights / weights.sum()
        for e, weight in zip(chosen, weights):
            hidden = silu(w.gate_proj[e] @ x[t]) * (w.up_proj[e] @ x[t])  # [I]
            out[t] += (w.down_proj[e] @ hidden) * weight
    shared_gate = 0.5 * (1.0 + np.tanh(0.5 * (x @ w.shared_expert_gate.T)))  # [T, 1], sigmoid
    return out + mlp(x, w.shared_expert) * shared_gate


# ====================================================================================================== cache
_cache_ids = itertools.count()


@dataclass
class HybridCache:
    """Per-layer caches (:class:`~lumotree.reference.gdn.GDNLayerCache` for GDN layers,
    :class:`~lumotree.reference.attention.KVCache` for attention layers) and ``length``: committed tokens
    (the position of the next token). ``version`` counts mutations; ``uid`` tells caches apart."""

    layers: list[Union[GDNLayerCache, KVCache]]
    length: int = 0
    version: int = 0
    uid: int = field(default_factory=lambda: next(_cache_ids))

    def copy(self) -> HybridCache:
        """An independent deep copy (a new ``uid``)."""
        return HybridCache([layer.copy() for layer in self.layers], self.length)

    def _replace(self, layers: list, length: int) -> None:
        self.layers = layers
        self.length = length
        self.version += 1


class TreePass(NamedTuple):
    """The result of a tree verification pass: ``logits: [N, vocab]`` and, per layer, what its commit needs
    (:class:`~lumotree.reference.gdn.GDNTreeRecord` or :class:`~lumotree.reference.attention.AttentionTreeRecord`).
    ``tokens, tree, cache_uid, cache_version`` identify the inputs it was computed from."""

    logits: np.ndarray
    records: tuple
    tokens: tuple[int, ...]
    tree: TokenTree
    cache_uid: int
    cache_version: int


# ====================================================================================================== model
class HybridModel:
    """The Qwen3-Next hybrid model in float64 (see the module docstring for the math and the API)."""

    def __init__(self, config: HybridConfig, weights: ModelWeights):
        if not isinstance(config, HybridConfig):
            raise TypeError(f"config must be a HybridConfig, got {type(config).__name__}")
        self.config = config
        self.weights = _validated_weights(weights, config)
        self._gdn_spec = config.gdn_spec() if "linear_attention" in config.layer_types else None
        self._attention_spec = config.attention_spec() if "full_attention" in config.layer_types else None
        self._last_pass: TreePass | None = None

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def new_cache(self) -> HybridCache:
        """An empty cache: zero conv and recurrent states, empty KV caches, length 0."""
        layers: list[GDNLayerCache | KVCache] = [
            GDNLayerCache.empty(self._gdn_spec) if kind == "linear_attention" else KVCache.empty(self._attention_spec)
            for kind in self.config.layer_types
        ]
        return HybridCache(layers)

    # ------------------------------------------------------------------------------------------------ checks
    def _check_tokens(self, name: str, token_ids) -> np.ndarray:
        ids = np.asarray(token_ids)
        if ids.ndim != 1 or ids.shape[0] == 0:
            raise ValueError(f"{name} must be a non-empty 1-D sequence of token ids, got shape {ids.shape}")
        if ids.dtype.kind not in "iu":
            if ids.dtype == object and all(isinstance(t, Integral) and not isinstance(t, bool) for t in ids):
                ids = ids.astype(np.int64)
            else:
                raise ValueError(f"{name} must hold integer token ids, got dtype {ids.dtype}")
        bad = np.flatnonzero((ids < 0) | (ids >= self.vocab_size))
        if bad.size:
            raise ValueError(f"{name}[{bad[0]}] = {ids[bad[0]]} is outside the vocabulary [0, {self.vocab_size})")
        return ids.astype(np.int64)

    def _check_cache(self, cache: HybridCache) -> None:
        if not isinstance(cache, HybridCache):
            raise TypeError(f"cache must be a HybridCache (model.new_cache()), got {type(cache).__name__}")
        if len(cache.layers) != self.config.num_hidden_layers:
            raise ValueError(f"cache has {len(cache.layers)} layers, the model {self.config.num_hidden_layers}")
        for i, (kind, layer) in enumerate(zip(self.config.layer_types, cache.layers)):
            want = GDNLayerCache if kind == "linear_attention" else KVCache
            if not isinstance(layer, want):
                raise ValueError(f"cache.layers[{i}] is {type(layer).__name__}; {kind} needs {want.__name__}")
        for i, layer in enumerate(cache.layers):
            if isinstance(layer, KVCache):
                spec = self._attention_spec
                for name in ("keys", "values"):
                    check_shape(f"cache.layers[{i}].{name}", np.asarray(getattr(layer, name)),
                                (cache.length, spec.num_kv_heads, spec.head_dim), "length, Hkv, Dh")
            else:
                spec = self._gdn_spec
                check_shape(f"cache.layers[{i}].conv_state", np.asarray(layer.conv_state),
                            (spec.conv_kernel - 1, spec.conv_dim), "W - 1, C")
                check_shape(f"cache.layers[{i}].state", np.asarray(layer.state),
                            (spec.num_v_heads, spec.head_k_dim, spec.head_v_dim), "HV, K, V")

    def _check_tree(self, tokens, tree) -> tuple[np.ndarray, TokenTree]:
        if not isinstance(tree, TokenTree):
            tree = TokenTree(tree)
        if tokens is None:
            if tree.tokens is None:
                raise ValueError("tokens is None and the tree carries no tokens")
            tokens = tree.tokens
        ids = self._check_tokens("tokens", tokens)
        if ids.shape[0] != tree.num_nodes:
            raise ValueError(f"tokens has {ids.shape[0]} entries but the tree has {tree.num_nodes} nodes")
        if tree.tokens is not None and tuple(ids.tolist()) != tree.tokens:
            raise ValueError("tokens differ from the tokens the tree carries")
        return ids, tree

    # ------------------------------------------------------------------------------------------------ passes
    def _logits(self, h: np.ndarray) -> np.ndarray:
        head = self.weights.embed_tokens if self.weights.lm_head is None else self.weights.lm_head
        return zero_centred_rmsnorm(h, self.weights.norm, self.config.rms_norm_eps) @ head.T  # [T, vocab]

    def _mlp(self, i: int, x: np.ndarray) -> np.ndarray:
        block = self.weights.layers[i].mlp
        if isinstance(block, MoEWeights):
            return moe(x, block, self.config.num_experts_per_tok, self.config.norm_topk_prob)
        return mlp(x, block)

    def forward(self, token_ids: Sequence[int] | np.ndarray, cache: HybridCache) -> np.ndarray:
        """Run ``T`` tokens in order from the cache (prefill, or decode when T = 1): float64 logits ``[T, vocab]``.

        Advances ``cache`` by T tokens (all layers at once, only if the whole pass succeeds). GDN layers use the
        recurrence (:func:`~lumotree.reference.gdn.chain`), attention layers the causal (chain) mask.
        """
        ids = self._check_tokens("token_ids", token_ids)
        self._check_cache(cache)
        eps = self.config.rms_norm_eps
        h = self.weights.embed_tokens[ids]  # [T, D]
        new_layers: list[GDNLayerCache | KVCache] = []
        for i, layer in enumerate(self.weights.layers):
            x = zero_centred_rmsnorm(h, layer.input_layernorm, eps)  # [T, D]
            if isinstance(layer.mixer, GDNWeights):
                out, new_cache = gdn.gdn_layer_chain(x, layer.mixer, self._gdn_spec, cache.layers[i])
            else:
                out, new_cache = attention.attention_layer_chain(x, layer.mixer, self._attention_spec,
                                                                 cache.layers[i])
            new_layers.append(new_cache)
            h = h + out
            h = h + self._mlp(i, zero_centred_rmsnorm(h, layer.post_attention_layernorm, eps))
        logits = self._logits(h)
        cache._replace(new_layers, cache.length + ids.shape[0])
        return logits

    def tree_pass(self, tokens, tree: TokenTree, cache: HybridCache) -> TreePass:
        """Logits of every node of a draft tree plus the per-layer records a commit needs; the cache is untouched.

        Node i sits at position ``cache.length + depth(i)``; node 0 is the pending token. GDN layers use the closed
        form (:func:`~lumotree.reference.gdn.tree_closed_form`) and the tree-window conv; attention layers the
        ancestor mask.
        """
        ids, tree = self._check_tree(tokens, tree)
        self._check_cache(cache)
        eps = self.config.rms_norm_eps
        h = self.weights.embed_tokens[ids]  # [N, D]
        records: list[GDNTreeRecord | AttentionTreeRecord] = []
        for i, layer in enumerate(self.weights.layers):
            x = zero_centred_rmsnorm(h, layer.input_layernorm, eps)  # [N, D]
            if isinstance(layer.mixer, GDNWeights):
                out, record = gdn.gdn_layer_tree(x, layer.mixer, self._gdn_spec, cache.layers[i], tree)
            else:
                out, record = attention.attention_layer_tree(x, layer.mixer, self._attention_spec, cache.layers[i],
                                                             tree)
            records.append(record)
            h = h + out
            h = h + self._mlp(i, zero_centred_rmsnorm(h, layer.post_attention_layernorm, eps))
        result = TreePass(self._logits(h), tuple(records), tuple(ids.tolist()), tree, cache.uid, cache.version)
        self._last_pass = result
        return result

    def verify_tree(self, tokens, tree: TokenTree, cache: HybridCache) -> np.ndarray:
        """Logits ``[N, vocab]`` of every node of ``tree`` (``tokens``: the nodes' token ids, node 0 the pending token;
        ``None`` takes ``tree.tokens``). Does not touch the cache."""
        return self.tree_pass(tokens, tree, cache).logits

    def commit(self, tokens, tree: TokenTree, node: int, cache: HybridCache) -> None:
        """Advance ``cache`` along the path root..``node`` of ``tree`` (``depth(node) + 1`` tokens).

        Reuses the last :meth:`tree_pass` / :meth:`verify_tree` records when they were computed from the same tokens,
        tree and cache state, else recomputes them. Then: GDN states rebuilt from factors
        (:func:`~lumotree.reference.gdn.commit`), conv states from the path inputs, KV compaction.
        """
        ids, tree = self._check_tree(tokens, tree)
        last = self._last_pass
        if (last is not None and last.tokens == tuple(ids.tolist()) and last.tree.parents == tree.parents
                and last.cache_uid == cache.uid and last.cache_version == cache.version):
            tree_pass = last
        else:
            tree_pass = self.tree_pass(ids, tree, cache)
        self.commit_pass(tree_pass, node, cache)

    def commit_pass(self, tree_pass: TreePass, node: int, cache: HybridCache) -> None:
        """Advance ``cache`` to ``node`` using a :class:`TreePass` computed from this very cache state."""
        self._check_cache(cache)
        if tree_pass.cache_uid != cache.uid or tree_pass.cache_version != cache.version:
            raise ValueError("tree_pass was computed from a different cache state than the one being committed")
        tree = tree_pass.tree
        path_len = len(tree.path(node))
        new_layers: list[GDNLayerCache | KVCache] = []
        for layer_cache, record in zip(cache.layers, tree_pass.records):
            if isinstance(record, GDNTreeRecord):
                new_layers.append(gdn.gdn_layer_commit(record, layer_cache, tree, node))
            else:
                new_layers.append(attention.attention_layer_commit(record, layer_cache, tree, node))
        cache._replace(new_layers, cache.length + path_len)


# ====================================================================================================== builders, I/O
def build_random(config: HybridConfig, seed: int = 0) -> HybridModel:
    """A seeded model with weights of useful size: projections ``N(0, 1/fan_in)``, embeddings ``N(0, 1)``,
    zero-centred norm weights ``N(0, 0.1^2)``, gated-norm weights ``1 + N(0, 0.1^2)``, conv ``N(0, 0.5^2)``,
    ``A = exp(A_log) ~ U(0.1, 2)``, ``dt_bias ~ N(0, 0.5^2)`` (decays mostly in 0.2 .. 0.95)."""
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for name, shape in hf_tensor_shapes(config).items():
        leaf = name.rsplit(".", 2)[-2] if name.endswith(".weight") else name.rsplit(".", 1)[-1]
        if name == "model.embed_tokens.weight":
            t = rng.standard_normal(shape)
        elif name.endswith("A_log"):
            t = np.log(rng.uniform(0.1, 2.0, shape))
        elif name.endswith("dt_bias"):
            t = rng.normal(0.0, 0.5, shape)
        elif leaf == "conv1d":
            t = rng.normal(0.0, 0.5, shape)
        elif name.endswith("linear_attn.norm.weight"):
            t = 1.0 + rng.normal(0.0, 0.1, shape)
        elif len(shape) == 1:  # zero-centred RMSNorm weights
            t = rng.normal(0.0, 0.1, shape)
        else:
            t = rng.standard_normal(shape) / np.sqrt(shape[-1])
        tensors[name] = t
    return HybridModel(config, weights_from_tensors(tensors, config))


def load_pretrained(path: str | os.PathLike) -> HybridModel:
    """Load a HF ``Qwen3NextForCausalLM`` checkpoint directory (config.json + safetensors, sharded or not) in float64.

    Unknown config keys, missing / unexpected / wrong-shape / non-finite tensors raise ``ValueError`` naming them.
    """
    config = HybridConfig.from_dict(read_config(path))
    return HybridModel(config, weights_from_tensors(read_tensors(path), config))


def save_pretrained(model: HybridModel, path: str | os.PathLike, dtype: str = "float64",
                    max_shard_bytes: int | None = None) -> None:
    """Write ``model`` as a HF checkpoint directory that transformers' ``Qwen3NextForCausalLM.from_pretrained`` and
    :func:`load_pretrained` read (``dtype`` float64 keeps the weights exactly; ``max_shard_bytes`` shards)."""
    write_checkpoint(path, model.config.to_dict(), weights_to_tensors(model.weights, model.config), dtype=dtype,
                     max_shard_bytes=max_shard_bytes)
