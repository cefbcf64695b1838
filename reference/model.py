r"""The hybrid model (Qwen3-Next and Qwen3.5), exact in float64: prefill, decode, tree verify, commit, HF checkpoints.

Layer i is ``config.layer_types[i]``: ``"full_attention"`` (gated attention, :mod:`~lumotree.reference.attention`)
or ``"linear_attention"`` (GDN, :mod:`~lumotree.reference.gdn`). Every block is::

    h = h + mixer(rmsnorm0(h; input_layernorm))
    h = h + mlp(rmsnorm0(h; post_attention_layernorm))
    logits = rmsnorm0(h; norm) @ lm_head^T          (lm_head = embed_tokens when tie_word_embeddings)

with ``rmsnorm0(x; w) = x * rsqrt(mean(x^2) + eps) * (1 + w)``. The MLP is a dense SwiGLU
``down(silu(gate x) * up x)`` or the MoE block: router ``p = softmax(W_r x)``, the top-k experts by ``p`` weighted by
``p`` (renormalised to sum 1 when ``norm_topk_prob``), plus ``sigmoid(w_s . x) * shared_expert(x)``.

API (others rely on these names): ``model.new_cache()``; ``model.forward(token_ids, cache)`` -> logits ``[T, vocab]``
and advances the cache (``return_hidden=True``: also the final-normed hidden states ``[T, D]``, the LM head's input,
which the MTP head of :mod:`~lumotree.reference.mtp` reads); ``model.verify_tree(tokens, tree, cache)`` -> logits
``[N, vocab]`` of every node, cache untouched (``model.tree_pass``: also every node's hidden state);
``model.commit(tokens, tree, node, cache)`` advances every layer cache along the path to ``node``
(GDN states from the factors, conv states from the path inputs, KV compaction). ``load_pretrained(path)``,
``save_pretrained(model, path)`` read and write HF checkpoints of every supported model type (Qwen3-Next, Qwen3.5
dense and MoE, and Qwen3.5's conditional-generation checkpoints' text model; :mod:`~lumotree.reference.layouts`),
small ones only (:data:`REFERENCE_MAX_PARAMETERS`); ``build_random(config, seed)`` makes a seeded model. The weights
and their canonical tensors are :mod:`~lumotree.reference.weights`'s (re-exported here).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from numbers import Integral
from typing import Any, NamedTuple, Union

import numpy as np

from . import attention, gdn
from .attention import AttentionTreeRecord, KVCache, zero_centred_rmsnorm
from .checkpoint import read_config, read_tensors, tensor_table, write_checkpoint
from .config import HybridConfig
from .gdn import GDNLayerCache, GDNTreeRecord, GDNWeights, silu
from .layouts import CheckpointLayout, resolve_checkpoint
from .numerics import check_finite, check_shape
from .tree import TokenTree
from .weights import (
    DecoderLayerWeights,
    MLPWeights,
    MoEWeights,
    ModelWeights,
    MTPWeights,
    hf_tensor_shapes,
    mtp_tensor_shapes,
    validated_weights,
    weights_from_tensors,
    weights_to_tensors,
)

__all__ = [
    "HybridConfig",
    "MLPWeights",
    "MoEWeights",
    "DecoderLayerWeights",
    "MTPWeights",
    "ModelWeights",
    "HybridCache",
    "TreePass",
    "HybridModel",
    "mlp",
    "moe",
    "mlp_block",
    "decoder_block",
    "build_random",
    "load_pretrained",
    "save_pretrained",
    "hf_tensor_shapes",
    "mtp_tensor_shapes",
    "weights_to_tensors",
    "weights_from_tensors",
    "REFERENCE_MAX_PARAMETERS",
]

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


def mlp_block(x: np.ndarray, block: MLPWeights | MoEWeights, config: HybridConfig) -> np.ndarray:
    """A layer's MLP on ``x: [T, D]``: :func:`moe` (with the config's top-k rule) or the dense :func:`mlp`."""
    if isinstance(block, MoEWeights):
        return moe(x, block, config.num_experts_per_tok, config.norm_topk_prob)
    return mlp(x, block)


def decoder_block(h: np.ndarray, layer: DecoderLayerWeights, config: HybridConfig, mixer) -> tuple[np.ndarray, Any]:
    """One pre-norm block on the residual stream ``h: [T, D]``::

        h = h + mixer(rmsnorm0(h; input_layernorm))
        h = h + mlp_block(rmsnorm0(h; post_attention_layernorm))

    ``mixer(x) -> (out [T, D], state)`` runs the layer's mixer (GDN or attention, chain or tree) on the normed input;
    returns ``(h, state)``. The model's layers and the MTP head's layers are both this block."""
    eps = config.rms_norm_eps
    out, state = mixer(zero_centred_rmsnorm(h, layer.input_layernorm, eps))
    h = h + out
    return h + mlp_block(zero_centred_rmsnorm(h, layer.post_attention_layernorm, eps), layer.mlp, config), state


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
    ``tokens, tree, cache_uid, cache_version`` identify the inputs it was computed from; ``hidden: [N, D]`` holds
    every node's final-normed hidden state (the LM head's input; the accepted path's rows are what the MTP head
    reads after the commit)."""

    logits: np.ndarray
    records: tuple
    tokens: tuple[int, ...]
    tree: TokenTree
    cache_uid: int
    cache_version: int
    hidden: np.ndarray | None = None


# ====================================================================================================== model
class HybridModel:
    """The hybrid model in float64 (see the module docstring for the math and the API)."""

    def __init__(self, config: HybridConfig, weights: ModelWeights):
        if not isinstance(config, HybridConfig):
            raise TypeError(f"config must be a HybridConfig, got {type(config).__name__}")
        self.config = config
        self.weights = validated_weights(weights, config)
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
    @property
    def lm_head(self) -> np.ndarray:
        """The LM head ``[vocab, D]`` (the embedding when the config ties them and no head is stored)."""
        return self.weights.embed_tokens if self.weights.lm_head is None else self.weights.lm_head

    def final_hidden(self, h: np.ndarray) -> np.ndarray:
        """``rmsnorm0(h; norm)``: the final-normed hidden states ``[T, D]`` whose product with :attr:`lm_head` are the
        logits."""
        return zero_centred_rmsnorm(h, self.weights.norm, self.config.rms_norm_eps)

    def forward(self, token_ids: Sequence[int] | np.ndarray, cache: HybridCache, return_hidden: bool = False
                ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Run ``T`` tokens in order from the cache (prefill, or decode when T = 1): float64 logits ``[T, vocab]``,
        and with ``return_hidden`` also their final-normed hidden states ``[T, D]`` (:meth:`final_hidden`).

        Advances ``cache`` by T tokens (all layers at once, only if the whole pass succeeds). GDN layers use the
        recurrence (:func:`~lumotree.reference.gdn.chain`), attention layers the causal (chain) mask.
        """
        ids = self._check_tokens("token_ids", token_ids)
        self._check_cache(cache)
        h = self.weights.embed_tokens[ids]  # [T, D]
        new_layers: list[GDNLayerCache | KVCache] = []
        for i, layer in enumerate(self.weights.layers):
            if isinstance(layer.mixer, GDNWeights):
                def mixer(x, w=layer.mixer, c=cache.layers[i]):
                    return gdn.gdn_layer_chain(x, w, self._gdn_spec, c)
            else:
                def mixer(x, w=layer.mixer, c=cache.layers[i]):
                    return attention.attention_layer_chain(x, w, self._attention_spec, c)
            h, new_cache = decoder_block(h, layer, self.config, mixer)
            new_layers.append(new_cache)
        hidden = self.final_hidden(h)  # [T, D]
        logits = hidden @ self.lm_head.T  # [T, vocab]
        cache._replace(new_layers, cache.length + ids.shape[0])
        return (logits, hidden) if return_hidden else logits

    def tree_pass(self, tokens, tree: TokenTree, cache: HybridCache) -> TreePass:
        """Logits of every node of a draft tree plus the per-layer records a commit needs; the cache is untouched.

        Node i sits at position ``cache.length + depth(i)``; node 0 is the pending token. GDN layers use the closed
        form (:func:`~lumotree.reference.gdn.tree_closed_form`) and the tree-window conv; attention layers the
        ancestor mask.
        """
        ids, tree = self._check_tree(tokens, tree)
        self._check_cache(cache)
        h = self.weights.embed_tokens[ids]  # [N, D]
        records: list[GDNTreeRecord | AttentionTreeRecord] = []
        for i, layer in enumerate(self.weights.layers):
            if isinstance(layer.mixer, GDNWeights):
                def mixer(x, w=layer.mixer, c=cache.layers[i]):
                    return gdn.gdn_layer_tree(x, w, self._gdn_spec, c, tree)
            else:
                def mixer(x, w=layer.mixer, c=cache.layers[i]):
                    return attention.attention_layer_tree(x, w, self._attention_spec, c, tree)
            h, record = decoder_block(h, layer, self.config, mixer)
            records.append(record)
        hidden = self.final_hidden(h)  # [N, D]
        result = TreePass(hidden @ self.lm_head.T, tuple(records), tuple(ids.tolist()), tree, cache.uid,
                          cache.version, hidden)
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
#: the largest checkpoint :func:`load_pretrained` reads (parameters of the text model and MTP head): float64 on the
#: host, 8 bytes a parameter; larger models are the optimized backend's
REFERENCE_MAX_PARAMETERS = 1 << 28


def build_random(config: HybridConfig, seed: int = 0) -> HybridModel:
    """A seeded model with weights of useful size: projections ``N(0, 1/fan_in)``, embeddings ``N(0, 1)``,
    zero-centred norm weights ``N(0, 0.1^2)``, gated-norm weights ``1 + N(0, 0.1^2)``, conv ``N(0, 0.5^2)``,
    ``A = exp(A_log) ~ U(0.1, 2)``, ``dt_bias ~ N(0, 0.5^2)`` (decays mostly in 0.2 .. 0.95). The MTP head's
    weights (``config.mtp_num_hidden_layers``) are drawn after the text model's."""
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for name, shape in {**hf_tensor_shapes(config), **mtp_tensor_shapes(config)}.items():
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


def load_pretrained(path: str | os.PathLike, max_parameters: int | None = None) -> HybridModel:
    """Load a HF checkpoint directory of any supported model type (config.json + safetensors, sharded or not;
    :mod:`~lumotree.reference.layouts`) in float64, the MTP head's tensors included.

    Unknown config keys, missing / unexpected / wrong-shape tensors raise ``ValueError`` naming them before any
    tensor data is read; non-finite values name the tensor too. A checkpoint of more than ``max_parameters``
    (default :data:`REFERENCE_MAX_PARAMETERS`) is refused in one line: the exact path holds every weight in float64.
    """
    config, layout, names = _checked_checkpoint(path, max_parameters)
    stored = read_tensors(path, names)
    for name, t in stored.items():  # by stored name, before the layout's conversion renames any
        check_finite(f"tensor {name!r}", t)
    return HybridModel(config, weights_from_tensors(layout.to_canonical(stored.__getitem__, config, stored), config))


def _checked_checkpoint(path, max_parameters):
    table = tensor_table(path)
    config, layout = resolve_checkpoint(read_config(path), table)
    names = layout.check(config, table)
    limit = REFERENCE_MAX_PARAMETERS if max_parameters is None else max_parameters
    count = sum(table[name].numel for name in names)
    if count > limit:
        raise ValueError(f"checkpoint {str(path)!r} holds {count:,} parameters, above the reference backend's limit of "
                         f"{limit:,} (float64 on the host): run it on the optimized backend (--backend optimized)")
    return config, layout, names


def save_pretrained(model: HybridModel, path: str | os.PathLike, dtype: str = "float64",
                    max_shard_bytes: int | None = None) -> None:
    """Write ``model`` as a HF checkpoint directory of ``model.config.model_type`` (the text model under ``model.``,
    experts one by one, as transformers saves it) that transformers' ``from_pretrained`` of that type and
    :func:`load_pretrained` read (``dtype`` float64 keeps the weights exactly; ``max_shard_bytes`` shards)."""
    config = model.config
    layout = CheckpointLayout(config.model_type)
    write_checkpoint(path, config.to_dict(), layout.from_canonical(weights_to_tensors(model.weights, config), config),
                     dtype=dtype, max_shard_bytes=max_shard_bytes)
