r"""Drafters for the engine: batched over requests, addressed by slot, each reporting path confidences.

A drafter proposes, for every running request, a :class:`Draft`: a tree rooted at the request's pending token, the
*path confidence* of every node (the drafter's estimate that the node gets accepted; the budget sums them, see
:mod:`lumotree.optimized.engine.budget`) and, for sampled proposals, the distributions the tokens were drawn from.

- :class:`PromptLookupDrafter` (no model): suffix matching over the request's own tokens (prompt + output) through an
  incremental n-gram index; the continuations that followed earlier occurrences of the last n tokens form a trie.
  Confidence of a node: the share of matches (weighted by n-gram length) whose continuation passes through it.
  Deterministic proposals.
- :class:`DraftModelDrafter`: a small hybrid model with its own caches (e.g. two of the target's layers with the
  target's embedding, final norm and head: :func:`lumotree.reference.drafters.layer_skip_draft`, or the optimized
  model's equivalent) grows dynamic trees EAGLE-2 style, batched: each round runs the draft model on the trees so far,
  expands the ``top_k`` frontier nodes of highest cumulative probability with their ``top_k`` children; the pool is cut
  to the budget by cumulative probability. Confidence = cumulative draft probability. Deterministic (top-k) proposals.
- Suffix decoding (``"suffix"``, :mod:`~lumotree.optimized.engine.suffix`) and self-speculation from the target's
  own layers (``"layer-skip"``, ``"gdn-only"``, :mod:`~lumotree.optimized.engine.selfspec`) live in their modules.
- :class:`~lumotree.optimized.engine.mtp.MTPDrafter` (``mtp``): the checkpoint's multi-token-prediction head on the
  target's own hidden states; chains and EAGLE-2 style trees; confidence = path probability under the head.
- :class:`~lumotree.optimized.engine.eagle.EagleDrafter` (``eagle``): a one-layer EAGLE head trained on the
  target's own outputs; EAGLE-2 dynamic trees with calibrated confidences.
- :class:`~lumotree.optimized.engine.router.RouterDrafter` (``router``): per step and request, the suffix cache's
  draft, the model drafter's or their merged tree, by predicted accepted tokens per unit of verify cost.
- :class:`SyntheticDrafter` — **SYNTHETIC, FOR SYSTEM BENCHMARKS ONLY**: it reads each request's true continuation
  from an oracle (e.g. the target's own greedy output recorded by an autoregressive run) and places the true next token
  among the children of on-path nodes at rank r with probability ``p (1 - p)^(r - 1)``; its confidences are exactly
  calibrated. It measures the system at a controlled per-token acceptance ``p``; it is not a way to decode.

Protocol (the engine calls these): ``admit(slot, prompt)``; ``propose(requests, max_nodes, chain) -> [Draft]``;
``advance(requests, accepted)`` with, per request, the tokens the step added to the committed context (the old pending
token and the accepted draft tokens); ``release(slot)``.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from .pruning import prune_indices
from .sampling import VARIANTS, SamplingParams, TreeBatch

__all__ = [
    "Draft",
    "DraftRequest",
    "EngineDrafter",
    "PromptLookupDrafter",
    "DraftModelDrafter",
    "SyntheticDrafter",
    "best_first_template",
    "make_drafter",
    "DRAFTERS",
]


@dataclass
class Draft:
    """One request's proposal. ``tokens[0]`` is the pending token; ``parents`` topological; ``confidence[i]`` the path
    confidence of node i (``confidence[0] = 1``, non-increasing along paths); ``proposal: [n, V]`` the drafter's
    distribution at each node for the ``iid`` / ``without_replacement`` variants (None for ``deterministic``);
    ``draws[u]``: the children of u in draw order (an ``iid`` token drawn twice is listed twice; None: index order).
    Sampled drafts are verified whole (the engine never cuts them: dropping draws by their value would bias them).
    ``best_first``: the non-root confidences are non-increasing in index order (None: not known yet, checked when
    needed; a drafter that builds its trees best-first says so and saves the check)."""

    tokens: list[int]
    parents: list[int]
    confidence: np.ndarray
    variant: str = "deterministic"
    proposal: torch.Tensor | None = None
    draws: list[list[int]] | None = None
    best_first: bool | None = None

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if len(self.parents) != n or len(self.confidence) != n or n < 1:
            raise ValueError(
                f"draft has {n} tokens, {len(self.parents)} parents, {len(self.confidence)} confidences; "
                "expected the same positive number"
            )
        if self.variant not in VARIANTS:
            raise ValueError(f"variant = {self.variant!r} is not one of {VARIANTS}")
        self.confidence = np.asarray(self.confidence, dtype=np.float64)

    @property
    def num_nodes(self) -> int:
        return len(self.tokens)

    def is_best_first(self) -> bool:
        """Whether the non-root confidences are non-increasing in index order (computed once)."""
        if self.best_first is None:
            self.best_first = bool(np.all(np.diff(self.confidence[1:]) <= 0))
        return self.best_first

    def sorted_confidences(self) -> np.ndarray:
        """Non-root path confidences, descending (what the budget sums)."""
        return self.confidence[1:] if self.is_best_first() else np.sort(self.confidence[1:])[::-1]

    def depth(self) -> list[int]:
        d = [0] * self.num_nodes
        for i in range(1, self.num_nodes):
            d[i] = d[self.parents[i]] + 1
        return d

    def cut(self, nodes: int, max_depth: int | None = None) -> Draft:
        """The ``nodes``-node subtree of highest path confidence, optionally no deeper than ``max_depth``: confidence
        pruning (:func:`~lumotree.optimized.engine.pruning.prune_indices`, shared by every drafter and the engine).
        Only deterministic drafts are cut: dropping sampled draws by their value would bias them."""
        if nodes >= self.num_nodes and (max_depth is None or self.num_nodes - 1 <= max_depth):
            return self
        # a cut of at most max_depth + 1 nodes cannot be too deep: no depths needed (then nodes < num_nodes)
        depth = None if max_depth is None or nodes - 1 <= max_depth else self.depth()
        if nodes >= self.num_nodes and max(depth) <= max_depth:
            return self
        if self.variant != "deterministic":
            raise ValueError("only deterministic drafts can be cut (sampled draws must stay as drawn)")
        if (depth is None or max(depth) <= max_depth) and self.is_best_first():  # the cut is a prefix
            n = min(nodes, self.num_nodes)
            return Draft(self.tokens[:n], self.parents[:n], self.confidence[:n], self.variant, None, best_first=True)
        keep, conf = prune_indices(self.parents, self.confidence, nodes, max_depth)
        index = {int(old): new for new, old in enumerate(keep)}
        return Draft(
            [self.tokens[i] for i in keep],
            [-1] + [index[self.parents[i]] for i in keep[1:]],
            conf,
            self.variant,
            None,
        )


@dataclass
class DraftRequest:
    """What a drafter sees of a running request: its slot, ``context`` (prompt + output; the last token is the
    pending one), sampling parameters, the seed/counter of its drafting coins, and ``remaining``: the tokens it has
    left to emit (None: not told), past which the engine verifies no deterministic draft."""

    slot: int
    context: list[int]
    params: SamplingParams
    seed: int = 0
    counter: int = 0
    request_id: int = 0
    remaining: int | None = None


@runtime_checkable
class EngineDrafter(Protocol):
    name: str
    description: str
    synthetic: bool

    def admit(self, slot: int, prompt: Sequence[int]) -> None: ...

    def propose(self, requests: Sequence[DraftRequest], max_nodes: int, chain: bool) -> list[Draft]: ...

    def advance(self, requests: Sequence[DraftRequest], committed: Sequence[Sequence[int]]) -> None: ...

    def release(self, slot: int) -> None: ...


def _root_only(request: DraftRequest) -> Draft:
    return Draft([request.context[-1]], [-1], np.ones(1))


# ======================================================================================================= n-gram
class PromptLookupDrafter:
    """Suffix matching over the request's own tokens (see the module docstring).

    ``max_ngram .. min_ngram``: suffix lengths tried; ``max_depth``: tokens per continuation; ``max_matches``: most
    recent occurrences used per suffix length. The index maps every n-gram (n <= max_ngram) of the committed context to
    the positions right after it; it grows as tokens are committed, so each step costs O(max_ngram * max_matches).
    """

    name = "ngram"
    description = "prompt lookup: continuations of earlier n-gram matches in the request's own tokens (no model)"
    synthetic = False
    runs_model = False  # tensor parallel: proposes on rank 0 only (engine.stepplan)

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, max_depth: int = 8, max_matches: int = 8):
        for name, v in (("max_ngram", max_ngram), ("min_ngram", min_ngram), ("max_depth", max_depth),
                        ("max_matches", max_matches)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} = {v!r} must be an integer >= 1")
        if min_ngram > max_ngram:
            raise ValueError(f"min_ngram = {min_ngram} must be <= max_ngram = {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.max_depth, self.max_matches = max_depth, max_matches
        self._tokens: dict[int, list[int]] = {}
        self._index: dict[int, dict[tuple[int, ...], list[int]]] = {}

    def admit(self, slot: int, prompt: Sequence[int]) -> None:
        self._tokens[slot] = []
        self._index[slot] = {}
        self._extend(slot, list(prompt))

    def release(self, slot: int) -> None:
        self._tokens.pop(slot, None)
        self._index.pop(slot, None)

    def _extend(self, slot: int, new: Sequence[int]) -> None:
        tokens, index = self._tokens[slot], self._index[slot]
        for tok in new:
            tokens.append(int(tok))
            end = len(tokens)  # the n-grams ending at position end-1 are followed by position end
            for n in range(1, self.max_ngram + 1):
                if end - n < 0:
                    break
                index.setdefault(tuple(tokens[end - n : end]), []).append(end)

    def continuations(self, slot: int, pending: int) -> list[tuple[tuple[int, ...], float]]:
        """(continuation, weight) pairs: what followed earlier occurrences of the context's suffix (the committed
        tokens plus the pending token), longest suffix and most recent first."""
        tokens = self._tokens[slot]
        ctx_tail = tokens[-(self.max_ngram - 1) :] if self.max_ngram > 1 else []
        ctx_tail = ctx_tail + [int(pending)]
        out: list[tuple[tuple[int, ...], float]] = []
        seen: set[tuple[int, ...]] = set()
        for n in range(min(self.max_ngram, len(ctx_tail)), self.min_ngram - 1, -1):
            positions = self._index[slot].get(tuple(ctx_tail[-n:]), [])
            for pos in reversed(positions[-self.max_matches :]):
                follow = tuple(tokens[pos : pos + self.max_depth])
                if follow and follow not in seen:
                    seen.add(follow)
                    out.append((follow, float(n)))
        return out

    def propose(self, requests: Sequence[DraftRequest], max_nodes: int, chain: bool) -> list[Draft]:
        drafts = []
        for r in requests:
            matches = self.continuations(r.slot, r.context[-1])
            if chain:
                matches = matches[:1]
            drafts.append(self._trie(r.context[-1], matches, max_nodes))
        return drafts

    @staticmethod
    def _trie(root: int, matches: list[tuple[tuple[int, ...], float]], max_nodes: int) -> Draft:
        parents, tokens, support = [-1], [int(root)], [0.0]
        child: dict[tuple[int, int], int] = {}
        total = sum(w for _, w in matches)
        for follow, weight in matches:
            node = 0
            support[0] += weight
            for tok in follow:
                key = (node, tok)
                if key not in child:
                    child[key] = len(tokens)
                    parents.append(node)
                    tokens.append(tok)
                    support.append(0.0)
                node = child[key]
                support[node] += weight
        conf = np.array(support) / total if total > 0 else np.ones(1)
        conf[0] = 1.0
        return Draft(tokens, parents, conf).cut(max_nodes)

    def advance(self, requests: Sequence[DraftRequest], committed: Sequence[Sequence[int]]) -> None:
        for r, new in zip(requests, committed):
            self._extend(r.slot, new)


# ======================================================================================================= draft model
class DraftModelDrafter:
    """EAGLE-2 style dynamic trees from a small draft model with its own caches (see the module docstring).

    ``model`` follows the engine's target protocol (:class:`lumotree.optimized.engine.TargetModel`): ``prefill``,
    ``verify``, ``commit``, ``release``, ``max_nodes``. Its cache for a slot holds the request's committed context;
    tokens committed by the target are ingested lazily (as a chain) at the next ``propose``, so autoregressive steps
    cost the draft model nothing.
    """

    name = "draft-model"
    synthetic = False

    def __init__(self, model: Any, top_k: int = 4, max_depth: int = 6, description: str | None = None):
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise ValueError(f"top_k = {top_k!r} must be an integer >= 1")
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 1:
            raise ValueError(f"max_depth = {max_depth!r} must be an integer >= 1")
        self.model = model
        self.top_k = top_k
        self.max_depth = max_depth
        self.description = description or "a small hybrid draft model with its own caches (EAGLE-2 style trees)"
        self._backlog: dict[int, list[int]] = {}

    def admit(self, slot: int, prompt: Sequence[int]) -> None:
        self.model.prefill(slot, list(prompt))
        self._backlog[slot] = []

    def release(self, slot: int) -> None:
        self._backlog.pop(slot, None)
        self.model.release(slot)

    def advance(self, requests: Sequence[DraftRequest], committed: Sequence[Sequence[int]]) -> None:
        for r, new in zip(requests, committed):
            self._backlog[r.slot].extend(int(t) for t in new)

    def _width(self, nodes: int) -> int:
        """Trees are padded to a power of two (at most the model's limit): few (batch, nodes) shapes, few graphs."""
        return min(self.model.max_nodes, 1 << max(0, nodes - 1).bit_length())

    def warm_up(self, batch_sizes: Sequence[int]) -> None:
        """Compile and capture the draft model's tree steps (verify at every padded width, and the commit of the
        chains it ingests) for every batch size in ``batch_sizes``, on slots ``0 .. B - 1`` (free; released after)."""
        widths = sorted({self._width(n) for n in range(1, self.model.max_nodes + 1)})
        for B in batch_sizes:
            slots = torch.arange(B, dtype=torch.int64, device=self.model.device)
            for width in widths:
                trees = TreeBatch.pack([[0] * width] * B, [[-1] + list(range(width - 1))] * B, width=width)
                for _ in range(2):  # the first call compiles, the second captures
                    for s in range(B):
                        self.model.prefill(s, [0, 0])
                    self.model.verify(slots, trees)
                    self.model.commit(slots, trees, trees.num_nodes - 1)
            for s in range(B):
                self.model.release(s)

    def _ingest(self, requests: Sequence[DraftRequest]) -> None:
        """Run the committed-but-unseen tokens of every request through the draft model (chains, batched)."""
        dev = self.model.device
        limit = self.model.max_nodes
        while True:
            todo = [r for r in requests if self._backlog[r.slot]]
            if not todo:
                return
            chunks = [self._backlog[r.slot][:limit] for r in todo]
            slots = torch.tensor([r.slot for r in todo], dtype=torch.int64, device=dev)
            trees = TreeBatch.pack(chunks, [[-1] + list(range(len(c) - 1)) for c in chunks],
                                   width=self._width(max(len(c) for c in chunks)))
            self.model.verify(slots, trees)
            self.model.commit(slots, trees, trees.num_nodes - 1)
            for r, c in zip(todo, chunks):
                del self._backlog[r.slot][: len(c)]

    def propose(self, requests: Sequence[DraftRequest], max_nodes: int, chain: bool) -> list[Draft]:
        if not requests:
            return []
        self._ingest(requests)
        dev = self.model.device
        k = 1 if chain else self.top_k
        B = len(requests)
        slots = torch.tensor([r.slot for r in requests], dtype=torch.int64, device=dev)
        tokens = [[r.context[-1]] for r in requests]
        parents: list[list[int]] = [[-1] for _ in requests]
        logp: list[list[float]] = [[0.0] for _ in requests]
        frontier: list[list[int]] = [[0] for _ in requests]
        room = self.model.max_nodes
        for _ in range(self.max_depth):
            if any(len(t) + len(f) * k > room for t, f in zip(tokens, frontier)):
                break
            trees = TreeBatch.pack(tokens, parents, width=self._width(max(len(t) for t in tokens)))
            logits = self.model.verify(slots, trees)  # [B, n, V]
            width = max(len(f) for f in frontier)
            rows = torch.tensor([f + [f[0]] * (width - len(f)) for f in frontier], device=dev)  # [B, width]
            front_logits = logits.gather(1, rows[:, :, None].expand(B, width, logits.shape[-1]))  # [B, width, V]
            top = torch.log_softmax(front_logits.float(), -1).topk(k, dim=-1)  # [B, width, k]
            top_logp, top_tok = top.values.cpu().numpy(), top.indices.cpu().numpy()
            new_frontier: list[list[int]] = []
            for b in range(B):
                fresh = []
                for j, u in enumerate(frontier[b]):
                    for r in range(k):
                        parents[b].append(u)
                        tokens[b].append(int(top_tok[b, j, r]))
                        logp[b].append(logp[b][u] + float(top_logp[b, j, r]))
                        fresh.append(len(tokens[b]) - 1)
                fresh.sort(key=lambda i: (-logp[b][i], i))
                new_frontier.append(fresh[:k])
            frontier = new_frontier
        return [Draft(t, p, np.exp(np.array(lp))).cut(max_nodes) for t, p, lp in zip(tokens, parents, logp)]


# ======================================================================================================= synthetic
def best_first_template(nodes: int, rank_confidence: Sequence[float]) -> tuple[list[int], list[int], list[float]]:
    """The ``nodes``-node tree of highest path confidence when the child of rank r (0-based) of any node has
    confidence ``rank_confidence[r]``: (parents, ranks, path confidences), built best-first with a heap."""
    parents, ranks, conf = [-1], [-1], [1.0]
    heap: list[tuple[float, int, int, int]] = []  # (-confidence, tie, parent, rank)
    tie = 0
    if rank_confidence:
        heapq.heappush(heap, (-rank_confidence[0], tie, 0, 0))
    while len(parents) < nodes and heap:
        neg, _, parent, rank = heapq.heappop(heap)
        node = len(parents)
        parents.append(parent)
        ranks.append(rank)
        conf.append(-neg)
        if rank + 1 < len(rank_confidence):  # the next sibling
            tie += 1
            heapq.heappush(heap, (-(conf[parent] * rank_confidence[rank + 1]), tie, parent, rank + 1))
        tie += 1
        heapq.heappush(heap, (-(conf[node] * rank_confidence[0]), tie, node, 0))  # the first child
    return parents, ranks, conf


class SyntheticDrafter:
    """**SYNTHETIC — FOR SYSTEM BENCHMARKS ONLY.** Controlled per-token acceptance from an oracle.

    ``oracle`` maps a prompt (tuple of ids) to its true continuation (e.g. the target's greedy output from an
    autoregressive run). At a node whose path follows the oracle, the true next token is the child of rank r
    (0-based) with probability ``p (1 - p)^r`` (r < ``branching``), else absent; the other children are distinct random
    tokens. Chains use rank 0 only, so a chain accepts each token with probability ``acceptance``. Reported confidences
    are these probabilities (exactly calibrated). Only meaningful with greedy verification; once a request's output
    leaves the oracle (e.g. a near-tie decided differently in bf16) its drafts are random.
    """

    name = "synthetic"
    synthetic = True
    runs_model = False

    def __init__(
        self,
        acceptance: float,
        oracle: Mapping[tuple[int, ...], Sequence[int]],
        vocab_size: int,
        branching: int = 4,
        seed: int = 0,
    ):
        if not 0.0 < float(acceptance) < 1.0:
            raise ValueError(f"acceptance = {acceptance!r} must be in (0, 1)")
        if branching < 1:
            raise ValueError(f"branching = {branching!r} must be >= 1")
        self.acceptance = float(acceptance)
        self.rank_confidence = [self.acceptance * (1 - self.acceptance) ** r for r in range(branching)]
        self.oracle = {tuple(int(t) for t in k): [int(t) for t in v] for k, v in oracle.items()}
        longest = max((len(v) for v in self.oracle.values()), default=0)
        # row i: the continuation of the i-th prompt, then -1 (built once, gathered per step)
        self._truth_row = {k: i for i, k in enumerate(self.oracle)}  # prompt -> row
        self._truth = np.full((len(self.oracle), longest + 1), -1, dtype=np.int64)  # [prompts, longest + 1]
        for k, v in self.oracle.items():
            self._truth[self._truth_row[k], : len(v)] = v
        self.vocab_size = int(vocab_size)
        self.rng = np.random.default_rng(seed)
        self.description = (
            f"SYNTHETIC (benchmarks only): oracle drafts with per-token acceptance {self.acceptance}, "
            f"rank r hit probability p(1-p)^r, branching {branching}"
        )
        self._prompt: dict[int, tuple[int, ...]] = {}
        self._templates: dict[tuple[int, bool], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        self.desynced = 0
        self._checked: dict[int, int] = {}  # slot -> generated tokens compared equal to the oracle (-1: a mismatch)

    def admit(self, slot: int, prompt: Sequence[int]) -> None:
        key = tuple(int(t) for t in prompt)
        if key not in self.oracle:
            raise KeyError("SyntheticDrafter: no oracle continuation for this prompt")
        self._prompt[slot] = key
        self._checked[slot] = 0

    def release(self, slot: int) -> None:
        self._prompt.pop(slot, None)
        self._checked.pop(slot, None)

    def _synced(self, slot: int, prompt: tuple, context: Sequence[int], done: int) -> bool:
        """Whether the request's generated tokens ``context[len(prompt):]`` (``done`` of them) are the oracle's
        continuation. A slot's output only grows, so only the tokens after the ones already compared are compared
        (a mismatch, once seen, stays: -1)."""
        checked = self._checked.get(slot, 0)
        if checked < 0:
            return False
        if done < checked:  # not a continuation of what was checked: compare it all
            checked = 0
        ok = self.oracle[prompt][checked:done] == list(context[len(prompt) + checked :])
        self._checked[slot] = done if ok else -1
        return ok

    def advance(self, requests: Sequence[DraftRequest], committed: Sequence[Sequence[int]]) -> None:
        """Stateless: the position comes from the context."""

    def _template(self, nodes: int, chain: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
        """(parents, ranks, path confidences, child_at[node, rank], depth of the deepest node) of the best-first
        tree, cached per size."""
        key = (nodes, chain)
        if key not in self._templates:
            ranks_conf = self.rank_confidence[:1] if chain else self.rank_confidence
            parents, ranks, conf = best_first_template(nodes, ranks_conf)
            child_at = np.full((len(parents), len(self.rank_confidence)), -1, dtype=np.int64)  # [n, width]
            depth = [0] * len(parents)
            for i in range(1, len(parents)):
                child_at[parents[i], ranks[i]] = i
                depth[i] = depth[parents[i]] + 1
            self._templates[key] = (np.array(parents), np.array(ranks), np.array(conf), child_at, max(depth))
        return self._templates[key]

    def _draw_hits(self, B: int, n: int, nodes: int, chain: bool) -> np.ndarray:
        """[B, n]: the rank of the true next token among each node's children, rank r with probability
        ``rank_confidence[r]`` (>= the width: absent). ``nodes``, ``chain``: the template's key."""
        return np.searchsorted(np.cumsum(self.rank_confidence), self.rng.random((B, n)), side="right")

    def propose(self, requests: Sequence[DraftRequest], max_nodes: int, chain: bool) -> list[Draft]:
        """Vectorised over requests. Children of node u carry ``(base_u + rank) mod V`` (distinct siblings). The
        oracle path of a request runs from the root through the child of each node's drawn rank while that child
        exists and the oracle has a next token; along it, the child of the drawn rank gets the true token, and a
        sibling that would repeat it takes the value the hit rank freed (also where the drawn rank misses)."""
        parents, ranks, conf, child_at, max_depth = self._template(max_nodes, chain)
        n, B, V = len(parents), len(requests), self.vocab_size
        width = len(self.rank_confidence)
        levels = max_depth + 1
        row, pos = np.zeros(B, dtype=np.int64), np.full(B, -1, dtype=np.int64)  # [B] oracle row, tokens generated
        for b, r in enumerate(requests):
            prompt = self._prompt[r.slot]
            done = len(r.context) - len(prompt)  # generated tokens, the pending one included
            if self._synced(r.slot, prompt, r.context, done):
                row[b], pos[b] = self._truth_row[prompt], done
            else:
                self.desynced += 1
        cols = np.minimum(pos[:, None] + np.arange(levels)[None, :], self._truth.shape[1] - 1)  # [B, levels]
        truth_at = np.where(pos[:, None] >= 0, self._truth[row[:, None], cols], -1)  # [B, levels] next tokens, or -1
        base = self.rng.integers(0, V, size=(B, n))  # [B, n] per parent
        hit = self._draw_hits(B, n, max_nodes, chain)  # [B, n]
        tokens = np.empty((B, n), dtype=np.int64)  # [B, n]
        tokens[:, 0] = [r.context[-1] for r in requests]
        tokens[:, 1:] = (base[:, parents[1:]] + ranks[1:]) % V
        rows = np.arange(B)
        nxt = np.where(hit < width, child_at[np.arange(n)[None, :], np.minimum(hit, width - 1)], -1)  # [B, n]
        path = np.full((B, levels), -1, dtype=np.int64)  # [B, levels] the on-path node at each depth
        node = np.zeros(B, dtype=np.int64)
        for d in range(levels):
            node = np.where(truth_at[:, d] >= 0, node, -1)  # the walk stops where the oracle has no next token
            path[:, d] = node
            node = np.where(node >= 0, nxt[rows, np.maximum(node, 0)], -1)
            if (node < 0).all():
                break
        bb, dd = np.nonzero(path >= 0)  # every (request, depth) on a path: levels are independent (disjoint nodes)
        u, t = path[bb, dd], truth_at[bb, dd]
        c = nxt[bb, u]  # the hit child, or -1
        kids = child_at[u]  # [P, width]
        collide = (kids >= 0) & (tokens[bb[:, None], np.maximum(kids, 0)] == t[:, None]) & (kids != c[:, None])
        alt = (base[bb, u] + np.minimum(hit[bb, u], width)) % V  # [P] a value no sibling uses
        p_idx, r_idx = np.nonzero(collide)
        tokens[bb[p_idx], kids[p_idx, r_idx]] = alt[p_idx]
        found = c >= 0
        tokens[bb[found], c[found]] = t[found]
        parent_list = parents.tolist()
        return [Draft(tokens[b].tolist(), parent_list, conf, best_first=True) for b in range(B)]  # template order


DRAFTERS = ("ngram", "suffix", "draft-model", "layer-skip", "gdn-only", "mtp", "eagle", "router", "synthetic")


def make_drafter(
    name: str,
    *,
    draft_model: Any = None,
    target: Any = None,
    oracle: Mapping[tuple[int, ...], Sequence[int]] | None = None,
    vocab_size: int | None = None,
    acceptance: float = 0.8,
    **options: Any,
) -> EngineDrafter:
    """A drafter by name (:data:`DRAFTERS`): ``"ngram"``; ``"suffix"``
    (:class:`~lumotree.optimized.engine.suffix.SuffixDrafter`); ``"draft-model"``, ``"layer-skip"``, ``"gdn-only"``
    (need ``draft_model``, a :class:`~lumotree.optimized.engine.TargetModel`; the last two a subgraph of the target,
    :mod:`~lumotree.optimized.engine.selfspec`); ``"mtp"`` (needs ``target``, the engine's target model, whose MTP
    head drafts; :class:`~lumotree.optimized.engine.mtp.MTPDrafter`); ``"eagle"`` (needs ``target`` and the option
    ``eagle``, the head's folder; :class:`~lumotree.optimized.engine.eagle.EagleDrafter`); ``"router"`` (needs
    ``target``; options ``eagle`` / ``model_dir`` pick its model drafter, ``router`` a payoff-model file;
    :class:`~lumotree.optimized.engine.router.RouterDrafter`); ``"synthetic"`` (needs ``oracle`` and
    ``vocab_size``; benchmarks only). ``options`` go to the drafter's constructor."""
    if name == "ngram":
        return PromptLookupDrafter(**options)
    if name == "suffix":
        from .suffix import SuffixDrafter

        return SuffixDrafter(**options)
    if name in ("layer-skip", "gdn-only"):
        if draft_model is None:
            raise ValueError(f"drafter {name!r} needs draft_model (the target's subgraph as a model)")
        from .selfspec import SelfSpeculationDrafter

        return SelfSpeculationDrafter(draft_model, name, **options)
    if name == "draft-model":
        if draft_model is None:
            raise ValueError("drafter 'draft-model' needs draft_model")
        return DraftModelDrafter(draft_model, **options)
    if name == "mtp":
        if target is None:
            raise ValueError("drafter 'mtp' needs target (the model whose MTP head drafts)")
        from .mtp import MTPDrafter

        return MTPDrafter(target, **options)
    if name in ("eagle", "router"):
        if target is None:
            raise ValueError(f"drafter {name!r} needs target (it drafts from the target's hidden states)")
        from .router_training import learned_drafter

        return learned_drafter(name, target, **options)
    if name == "synthetic":
        if oracle is None or vocab_size is None:
            raise ValueError("drafter 'synthetic' needs oracle and vocab_size (it is for benchmarks only)")
        return SyntheticDrafter(acceptance, oracle, vocab_size, **options)
    raise ValueError(f"unknown drafter {name!r}; expected one of {DRAFTERS}")
