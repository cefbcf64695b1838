r"""The multi-token-prediction (MTP) head of Qwen3-Next and Qwen3.5, exact in float64: a drafter that reads the
target model's hidden states and keeps its own KV cache per request.

One head step at position p reads the target's hidden state ``h_p`` of context token p and the next token
``x_{p+1}``::

    u   = fc [ rmsnorm0(embed(x_{p+1}); pre_fc_norm_embedding) ; rmsnorm0(h_p; pre_fc_norm_hidden) ]    # [D]
    u   = decoder_block(u; mtp.layers[j])         j = 0 .. n - 1: attention with RoPE at position p over the head's
                                                  own KV cache, then the model's MLP (MoE by the model's rule for j)
    g_p = rmsnorm0(u; mtp.norm)
    logits_p = g_p @ lm_head^T                    a distribution over x_{p+2}

``h_p`` is the target's final-normed hidden state (:meth:`~lumotree.reference.model.HybridModel.final_hidden`, the
LM head's input): what vLLM's and SGLang's Qwen3-Next / Qwen3.5 MTP proposers pass. The embedding and the LM head are
the target's. Chained drafting feeds the head its own output: depth k + 1 reads ``(g, drafted token)`` of depth k at
position ``p + k`` (vLLM's MTP proposer: positions + 1 and the head's normed output each step). With several MTP
layers every step runs all of them in order (the released checkpoints have one).

The cache holds one entry per target position, entry p computed from ``(h_p, x_{p+1})``. While the target holds
``c_0 .. c_{L-1}`` and ``c_L`` is pending, the head holds entries ``0 .. L - 2`` and a draft tree is rooted at entry
``L - 1``, ``(h_{L-1}, c_L)``: tree node 0. Node u of depth d >= 1 (token ``t_u``) reads ``(g_{parent(u)}, t_u)`` at
position ``L - 1 + d`` and attends to the cache and its ancestors; its logits are those of u's children.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import attention
from .attention import KVCache, zero_centred_rmsnorm
from .model import HybridModel, decoder_block
from .tree import TokenTree

__all__ = ["MTPCache", "MTPHead"]


@dataclass
class MTPCache:
    """The head's per-request KV caches, one per MTP layer (:class:`~lumotree.reference.attention.KVCache`, entry p
    at position p)."""

    layers: list[KVCache]

    @property
    def length(self) -> int:
        """Entries held (the position of the next one)."""
        return self.layers[0].length

    def copy(self) -> MTPCache:
        return MTPCache([layer.copy() for layer in self.layers])


class MTPHead:
    """The MTP head of a :class:`~lumotree.reference.model.HybridModel` (module docstring for the math).

    - ``new_cache()``: an empty :class:`MTPCache`;
    - ``forward(hidden [T, D], token_ids [T], cache) -> (logits [T, V], g [T, D])``: entries ``cache.length ..`` from
      the pairs ``(hidden[t], token_ids[t])``, appended to the cache;
    - ``tree(hidden [N, D], tokens [N], tree, cache) -> (logits [N, V], g [N, D])``: every node of a draft tree
      (node i at position ``cache.length + depth(i)``), cache untouched.
    """

    def __init__(self, model: HybridModel):
        if not isinstance(model, HybridModel):
            raise TypeError(f"model must be a HybridModel, got {type(model).__name__}")
        if model.weights.mtp is None:
            raise ValueError("model has no MTP head (config.mtp_num_hidden_layers = 0: the checkpoint holds no mtp.* "
                             "tensors)")
        self.model = model
        self.config = model.config
        self.weights = model.weights.mtp
        self.spec = model.config.attention_spec()

    def new_cache(self) -> MTPCache:
        return MTPCache([KVCache.empty(self.spec) for _ in self.weights.layers])

    def _check(self, hidden, token_ids, cache: MTPCache) -> tuple[np.ndarray, np.ndarray]:
        ids = self.model._check_tokens("token_ids", token_ids)
        h = np.asarray(hidden, dtype=np.float64)
        if h.shape != (ids.shape[0], self.config.hidden_size):
            raise ValueError(f"hidden has shape {h.shape}, expected [T, D] = {(ids.shape[0], self.config.hidden_size)}")
        if not isinstance(cache, MTPCache) or len(cache.layers) != len(self.weights.layers):
            raise TypeError("cache must be an MTPCache of this head (head.new_cache())")
        return h, ids

    def _pass(self, hidden: np.ndarray, ids: np.ndarray, tree: TokenTree, cache: MTPCache):
        """``(logits [N, V], g [N, D], per-layer tree records)`` of the pairs ``(hidden[i], ids[i])`` on ``tree``."""
        w, eps = self.weights, self.config.rms_norm_eps
        embedded = zero_centred_rmsnorm(self.model.weights.embed_tokens[ids], w.pre_fc_norm_embedding, eps)  # [N, D]
        normed = zero_centred_rmsnorm(hidden, w.pre_fc_norm_hidden, eps)  # [N, D]
        u = np.concatenate([embedded, normed], axis=-1) @ w.fc.T  # [N, D]
        records = []
        for layer, kv in zip(w.layers, cache.layers):
            def mixer(x, mix=layer.mixer, kv=kv):
                return attention.attention_layer_tree(x, mix, self.spec, kv, tree)
            u, record = decoder_block(u, layer, self.config, mixer)
            records.append(record)
        g = zero_centred_rmsnorm(u, w.norm, eps)  # [N, D]
        return g @ self.model.lm_head.T, g, records

    def forward(self, hidden, token_ids, cache: MTPCache) -> tuple[np.ndarray, np.ndarray]:
        """Append the entries of ``T`` pairs ``(hidden[t], token_ids[t])`` at positions ``cache.length + t``; returns
        their logits ``[T, V]`` and normed outputs ``g: [T, D]``."""
        h, ids = self._check(hidden, token_ids, cache)
        chain = TokenTree.chain(ids.shape[0])
        logits, g, records = self._pass(h, ids, chain, cache)
        cache.layers = [attention.attention_layer_commit(record, kv, chain, chain.num_nodes - 1)
                        for record, kv in zip(records, cache.layers)]
        return logits, g

    def tree(self, hidden, tokens, tree: TokenTree, cache: MTPCache) -> tuple[np.ndarray, np.ndarray]:
        """Logits ``[N, V]`` and outputs ``g: [N, D]`` of every node of ``tree`` (node i reads ``(hidden[i],
        tokens[i])`` at position ``cache.length + depth(i)``); the cache is untouched."""
        if not isinstance(tree, TokenTree):
            tree = TokenTree(tree)
        h, ids = self._check(hidden, tokens, cache)
        if ids.shape[0] != tree.num_nodes:
            raise ValueError(f"tokens has {ids.shape[0]} entries but the tree has {tree.num_nodes} nodes")
        logits, g, _ = self._pass(h, ids, tree, cache)
        return logits, g
