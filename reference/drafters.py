"""Drafters for :func:`lumotree.reference.speculate.speculative_decode`: prompt lookup (n-gram) and a draft model.

Both satisfy :class:`lumotree.reference.speculate.Drafter` and propose a tree rooted at the pending token.

- :class:`NGramDrafter` (prompt lookup): finds earlier occurrences of the context's last n tokens in the request's
  own tokens (prompt + output) and proposes the tokens that followed them, several continuations merged into a trie.
  It has no model and no randomness: its proposals are deterministic (point masses), so sampling verification stays
  lossless.
- :class:`DraftModelDrafter`: a small hybrid model with its own caches (e.g. :func:`layer_skip_draft`, the target's
  first layers with its embedding, final norm and ``lm_head``) grows the tree EAGLE-2 style: expand the most probable
  nodes by cumulative draft path probability, each with its top-k (greedy / deterministic) or k sampled children
  (``"iid"``, ``"without_replacement"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral
from typing import Any

import numpy as np

from .speculate import Sampling
from .tree import TokenTree
from .verify import VARIANTS, Coins, DraftBuilder, DraftProposal, VerifyResult

__all__ = ["NGramDrafter", "DraftModelDrafter", "layer_skip_config", "layer_skip_draft"]


def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
        raise ValueError(f"{name} = {value!r} must be an integer >= {minimum}")
    return int(value)


class NGramDrafter:
    """Prompt-lookup drafting over the request's own tokens, several continuations per step.

    For ``n = max_ngram .. min_ngram``: every earlier position where the last ``n`` tokens of the context occurred
    (most recent first) contributes the up to ``max_depth`` tokens that followed it. The distinct continuations are
    merged into a trie below the pending token, longest matches first, until the tree has ``budget`` nodes. No match:
    the tree is the root alone (the step then emits one token, like plain decoding).
    """

    name = "ngram"
    description = "prompt lookup: continuations of earlier n-gram matches in the request's own tokens (no model)"

    def __init__(self, budget: int = 8, max_ngram: int = 3, min_ngram: int = 1, max_depth: int = 4):
        self.budget = _positive_int("budget", budget)
        self.max_ngram = _positive_int("max_ngram", max_ngram)
        self.min_ngram = _positive_int("min_ngram", min_ngram)
        self.max_depth = _positive_int("max_depth", max_depth)
        if self.min_ngram > self.max_ngram:
            raise ValueError(f"min_ngram = {min_ngram} must be <= max_ngram = {max_ngram}")

    def start(self, prompt: Sequence[int]) -> None:
        """Stateless: everything it needs is in the context."""

    def continuations(self, context: Sequence[int]) -> list[tuple[int, ...]]:
        """Distinct continuations of earlier matches of the context's suffix, longest n-gram and most recent first."""
        ctx = list(context)
        seen: set[tuple[int, ...]] = set()
        out: list[tuple[int, ...]] = []
        for n in range(min(self.max_ngram, len(ctx) - 1), self.min_ngram - 1, -1):
            suffix = ctx[-n:]
            for start in range(len(ctx) - n - 1, -1, -1):  # occurrences that end before the last position
                if ctx[start:start + n] == suffix:
                    follow = tuple(ctx[start + n:start + n + self.max_depth])
                    if follow and follow not in seen:
                        seen.add(follow)
                        out.append(follow)
        return out

    def propose(
        self, context: Sequence[int], sampling: Sampling | None = None, coins: Coins | None = None
    ) -> DraftProposal:
        prefixes: set[tuple[int, ...]] = set()
        kept: list[tuple[int, ...]] = []
        for follow in self.continuations(context):
            length = 0
            while length < len(follow) and (follow[:length + 1] in prefixes or 1 + len(prefixes) < self.budget):
                prefixes.add(follow[:length + 1])
                length += 1
            if length:
                kept.append(follow[:length])
            if 1 + len(prefixes) >= self.budget:
                break
        tree = TokenTree.from_sequences(int(context[-1]), kept)
        return DraftProposal(tree=tree, variant="deterministic")

    def advance(self, proposal: DraftProposal, result: VerifyResult) -> None:
        """Stateless."""


class DraftModelDrafter:
    """A draft model with its own caches grows the tree by cumulative draft path probability (EAGLE-2 style).

    Each round runs ``draft_model.verify_tree`` on the tree so far and expands the ``top_k`` most probable frontier
    nodes (cumulative draft log-probability, ties to the lower index) with ``top_k`` children each, for up to
    ``max_depth`` rounds.

    - Greedy, or sampling with ``variant="deterministic"``: the children are each node's top-k tokens; all of them
      enter a pool, and the ``budget - 1`` most probable pool nodes (with their ancestors) form the tree.
    - Sampling with ``"iid"`` / ``"without_replacement"``: children are drawn from ``Q_u = softmax(logits_u / T)``
      (:class:`DraftBuilder`) until the tree holds ``budget`` nodes; drawn nodes are never pruned, so the proposal
      records exactly what each token was drawn from and verification stays lossless.

    ``advance`` commits the accepted path into the draft model's caches, as the loop does for the target.
    """

    name = "draft-model"

    def __init__(
        self,
        draft_model: Any,
        budget: int = 8,
        top_k: int = 2,
        max_depth: int = 4,
        variant: str = "deterministic",
        description: str | None = None,
    ):
        self.model = draft_model
        self.budget = _positive_int("budget", budget)
        self.top_k = _positive_int("top_k", top_k)
        self.max_depth = _positive_int("max_depth", max_depth)
        if variant not in VARIANTS:
            raise ValueError(f"variant = {variant!r} is not one of {VARIANTS}")
        self.variant = variant
        self.description = description or "a separate small hybrid draft model with its own caches"
        self.cache: Any = None

    def start(self, prompt: Sequence[int]) -> None:
        self.cache = self.model.new_cache()
        self.model.forward(list(prompt), self.cache)

    def _tree_logits(self, builder: DraftBuilder) -> np.ndarray:
        tree = TokenTree(builder.parents, builder.tokens)
        return self.model.verify_tree(list(builder.tokens), tree, self.cache)  # [n, vocab]

    def propose(self, context: Sequence[int], sampling: Sampling | None, coins: Coins | None) -> DraftProposal:
        if self.cache is None:
            raise RuntimeError("DraftModelDrafter.propose before start(prompt)")
        variant = "deterministic" if sampling is None else self.variant
        temperature = Sampling(1.0) if sampling is None else sampling
        builder = DraftBuilder(int(context[-1]), variant)
        score = [0.0]  # cumulative draft log-probability per node
        frontier = [0]
        pruned = variant == "deterministic"  # deterministic pools are grown wide, then cut to the budget
        for _ in range(self.max_depth):
            if not frontier or (not pruned and builder.num_nodes >= self.budget):
                break
            probs = temperature.probabilities(self._tree_logits(builder))  # [n, vocab]
            children: list[int] = []
            for u in frontier:
                for _slot in range(self.top_k):
                    if not pruned and builder.num_nodes >= self.budget:
                        break
                    before = builder.num_nodes
                    child = builder.draw(u, probs[u], coins)
                    if child is None:
                        break
                    if builder.num_nodes > before:
                        score.append(score[u] + float(np.log(probs[u][builder.tokens[child]])))
                        children.append(child)
            frontier = sorted(children, key=lambda c: (-score[c], c))[: self.top_k]
        proposal = builder.proposal()
        return self._best_subtree(proposal, score) if pruned else proposal

    def _best_subtree(self, pool: DraftProposal, score: list[float]) -> DraftProposal:
        """The ``budget - 1`` highest-scoring pool nodes plus their ancestors, as a deterministic proposal."""
        tree = pool.tree
        keep = {0}
        for node in sorted(range(1, tree.num_nodes), key=lambda c: (-score[c], c)):
            missing = [a for a in tree.path(node) if a not in keep]
            if len(keep) + len(missing) <= self.budget:
                keep.update(missing)
            if len(keep) >= self.budget:
                break
        nodes = sorted(keep)  # topological: parents precede children
        index = {old: new for new, old in enumerate(nodes)}
        assert tree.tokens is not None
        parents = [-1 if tree.parents[old] < 0 else index[tree.parents[old]] for old in nodes]
        return DraftProposal(TokenTree(parents, [tree.tokens[old] for old in nodes]), "deterministic")

    def advance(self, proposal: DraftProposal, result: VerifyResult) -> None:
        tree = proposal.tree
        assert tree.tokens is not None
        self.model.commit(list(tree.tokens), tree, result.last_node, self.cache)


def layer_skip_config(config: Any, layers: Sequence[int]) -> tuple[Any, list[int]]:
    """The config of a model made of the target layers ``layers`` (strictly increasing, renumbered 0..), each keeping
    its mixer kind and its MLP kind; returns ``(draft_config, chosen)``. Shared by :func:`layer_skip_draft` and the
    optimized checkpoint-level version."""
    chosen = [int(i) for i in layers]
    if not chosen:
        raise ValueError("layers must name at least one target layer")
    for k, i in enumerate(chosen):
        if not 0 <= i < config.num_hidden_layers:
            raise ValueError(f"layers[{k}] = {i} is not a layer of the target (0..{config.num_hidden_layers - 1})")
        if k and i <= chosen[k - 1]:
            raise ValueError(f"layers must be strictly increasing, got {chosen}")
    moe = [config.is_moe_layer(i) for i in chosen]
    draft_config = config.replace(
        num_hidden_layers=len(chosen),
        layer_types=tuple(config.layer_types[i] for i in chosen),
        decoder_sparse_step=1,
        mlp_only_layers=tuple(j for j, is_moe in enumerate(moe) if not is_moe),
        num_experts=config.num_experts if any(moe) else 0,
        mtp_num_hidden_layers=0,  # the target's MTP head is not the draft's
    )
    return draft_config, chosen


def layer_skip_draft(target: Any, layers: Sequence[int] = (0,)) -> Any:
    """A draft model made of some of the target's layers (default: the first), with the target's embedding, final
    norm and ``lm_head`` (self-speculation by layer skipping). The weights are shared, not copied or trained; it has
    its own caches like any model. ``layers`` are target layer indices in increasing order.
    """
    from .model import HybridModel, ModelWeights

    draft_config, chosen = layer_skip_config(target.config, layers)
    w = target.weights
    return HybridModel(draft_config, ModelWeights(w.embed_tokens, [w.layers[i] for i in chosen], w.norm, w.lm_head))
