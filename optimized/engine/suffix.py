r"""Suffix decoding: drafts from suffix trees over the request's own tokens and over earlier requests' outputs.

A :class:`SuffixTree` of depth ``D`` holds every substring of length ``<= D`` of its sequences, each node counting
its *occurrences* (the positions where that substring ends). It grows by one token in ``O(D)``: the ``D`` suffixes
ending at the last token each get one child. A sequence can be removed again (every count it added is taken back,
nodes that reach zero are freed), which is what bounded memory needs.

Drafting (:meth:`SuffixTree.speculate`): for each match length ``L`` (the last ``L`` tokens of the context, the
pending token included, occur in the tree), the candidate tree below the match node ``m`` is grown best-first by
*empirical frequency*: node ``u`` below ``m`` has path confidence ``count(u) / count(m)``, the share of the earlier
occurrences of the pattern that went on with u's tokens (the product of the children's conditional frequencies along
the path). Nodes below ``min_token_prob`` are not drafted and a candidate has at most
``min(max_spec_tokens, floor(max_spec_factor * L + max_spec_offset))`` tokens: longer matches speculate further. Of
all match lengths, the candidate with the largest *score* (the sum of its confidences: its expected number of
accepted tokens when the frequencies are calibrated) wins.

:class:`SuffixCache` is the global tree over the outputs of finished requests, with bounded memory: at most
``max_requests`` outputs and ``capacity`` entries (trie nodes plus stored tokens); beyond either, whole outputs are
evicted, least recently used first (an output is used when it is inserted, or when the latest occurrence at a node of
a proposed draft lies in it).

:class:`SuffixDrafter` (engine drafter ``"suffix"``) keeps one tree per running request over its prompt and committed
output (it subsumes prompt lookup: the n-gram drafter's matches are its match nodes, with counts) and the global
cache; each step proposes the better-scoring candidate of the two.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .drafters import Draft, DraftRequest

__all__ = ["SuffixTree", "SuffixCandidate", "SuffixCache", "SuffixDrafter"]


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} = {value!r} must be an integer >= {minimum}")
    return int(value)


_TOKEN_BITS = 32  # a child's key: parent id << 32 | token (exact for token ids below 2^32)


@dataclass
class SuffixCandidate:
    """A draft below the match point: ``tokens[i]`` with parent ``parents[i]`` (-1: the pending token, else an index
    into these lists; topological), ``probs[i]`` its path confidence (non-increasing in index order), ``score`` the
    sum of ``probs``, ``match_len`` the pattern length it continues, ``sources`` the sequences it was read from."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    score: float = 0.0
    match_len: int = 0
    sources: set[int] = field(default_factory=set)


class SuffixTree:
    """Depth-bounded suffix tree (a trie of all substrings of length ``<= max_depth``) with occurrence counts, over
    any number of sequences addressed by id (module docstring). ``num_nodes`` counts the non-root nodes,
    ``num_tokens`` the stored tokens.

    Nodes are integers (the root is 0) into flat lists (occurrences, latest sequence, token, linked children) and one
    dict from ``parent << 32 | token`` to the child: growing by a token is about ``max_depth`` dict look-ups and
    allocates no object per node (nothing for the garbage collector to walk). Freed ids are reused."""

    def __init__(self, max_depth: int = 24):
        self.max_depth = _check_int("max_depth", max_depth, 1)
        self.num_nodes = 0
        self.num_tokens = 0
        self.sequences: dict[int, list[int]] = {}
        self._active: dict[int, list[int]] = {}  # open sequences: the nodes of their suffixes of length 0..D-1
        self._child: dict[int, int] = {}  # parent << 32 | token -> child
        # per node (flat lists: no object per node): occurrences of its substring, the latest sequence that passed
        # through it, the token on the edge into it, and its children as a linked list, newest first
        self._count: list[int] = [0]
        self._last: list[int] = [-1]
        self._token: list[int] = [-1]
        self._first: list[int] = [-1]  # newest child (-1: none)
        self._next: list[int] = [-1]  # next older sibling (-1: none)
        self._free: list[int] = []  # ids of freed nodes

    def extend(self, seq_id: int, tokens: Iterable[int]) -> None:
        """Append ``tokens`` (ids in ``[0, 2^32)``) to sequence ``seq_id`` (a new id starts a sequence);
        ``O(max_depth)`` per token."""
        seq = self.sequences.get(seq_id)
        if seq is None:
            seq = self.sequences[seq_id] = []
        elif seq_id not in self._active:
            raise ValueError(f"seq_id = {seq_id!r} is sealed: it cannot grow")
        active = self._active.get(seq_id) or [0]
        keep = self.max_depth  # the root and the suffixes of length 1 .. max_depth - 1 stay active
        child_of, count, last, token, first, nxt, free = \
            self._child, self._count, self._last, self._token, self._first, self._next, self._free
        before, created = len(seq), 0
        for tok in tokens:  # the drafter's per-token cost: keep this loop lean
            tok = int(tok)
            if not 0 <= tok < (1 << _TOKEN_BITS):
                raise ValueError(f"token {tok} is outside [0, 2^{_TOKEN_BITS})")
            seq.append(tok)
            grown = [0]
            for node in active:
                key = node << _TOKEN_BITS | tok
                child = child_of.get(key)
                if child is None:
                    if free:
                        child = free.pop()
                        count[child], last[child], token[child], first[child] = 1, seq_id, tok, -1
                        nxt[child] = first[node]
                    else:
                        child = len(count)
                        count.append(1)
                        last.append(seq_id)
                        token.append(tok)
                        first.append(-1)
                        nxt.append(first[node])
                    first[node] = child
                    child_of[key] = child
                    created += 1
                else:
                    count[child] += 1
                    last[child] = seq_id
                grown.append(child)
            active = grown if len(grown) <= keep else grown[:keep]
        self.num_nodes += created
        self.num_tokens += len(seq) - before
        self._active[seq_id] = active

    def seal(self, seq_id: int) -> None:
        """No more tokens for ``seq_id``: its growth state is dropped."""
        self._active.pop(seq_id, None)

    def remove(self, seq_id: int) -> None:
        """Take sequence ``seq_id`` out: every occurrence it added is uncounted, nodes left with none are freed."""
        if seq_id not in self.sequences:
            raise ValueError(f"seq_id = {seq_id!r} is not in the tree")
        seq = self.sequences.pop(seq_id)
        self._active.pop(seq_id, None)
        self.num_tokens -= len(seq)
        child_of, count, first, nxt = self._child, self._count, self._first, self._next
        for start in range(len(seq)):
            parent = 0
            for tok in seq[start : start + self.max_depth]:
                key = parent << _TOKEN_BITS | tok
                node = child_of[key]
                count[node] -= 1
                if count[node] == 0:  # its descendants on this path reach 0 in this walk too
                    del child_of[key]
                    if first[parent] == node:  # unlink it from its siblings
                        first[parent] = nxt[node]
                    else:
                        sibling = first[parent]
                        while nxt[sibling] != node:
                            sibling = nxt[sibling]
                        nxt[sibling] = nxt[node]
                    self._free.append(node)
                    self.num_nodes -= 1
                parent = node

    @property
    def memory(self) -> int:
        """Entries held: trie nodes plus stored tokens."""
        return self.num_nodes + self.num_tokens

    def find(self, pattern: Sequence[int]) -> int | None:
        """The node of ``pattern`` (None: it does not occur, or it is longer than ``max_depth``)."""
        if len(pattern) > self.max_depth:
            return None
        node: int | None = 0
        for tok in pattern:
            tok = int(tok)
            if not 0 <= tok < (1 << _TOKEN_BITS):
                return None
            node = self._child.get(node << _TOKEN_BITS | tok)
            if node is None:
                return None
        return node

    def match_nodes(self, seq_id: int, token: int) -> list[int]:
        """The nodes of ``(the last L - 1 tokens of open sequence seq_id) + token`` for L = 1, 2, .. as long as they
        occur (at most ``max_depth - 1``): what :meth:`find` gives for the suffixes of ``sequence + [token]``, read off
        the sequence's growth state with one look-up each instead of a walk from the root."""
        active = self._active.get(seq_id) or [0]
        child_of, token, out = self._child, int(token), []
        if not 0 <= token < (1 << _TOKEN_BITS):
            return out
        for node in active[: self.max_depth - 1]:
            child = child_of.get(node << _TOKEN_BITS | token)
            if child is None:
                break
            out.append(child)
        return out

    def _items(self, node: int) -> list[tuple[int, int]]:
        """``(token, child)`` of ``node``'s children, oldest first."""
        token, nxt, out = self._token, self._next, []
        child = self._first[node]
        while child >= 0:
            out.append((token[child], child))
            child = nxt[child]
        out.reverse()
        return out

    def count(self, pattern: Sequence[int]) -> int:
        """Occurrences of ``pattern`` (length 1..max_depth) in the sequences."""
        node = self.find(pattern)
        return 0 if node is None or not pattern else self._count[node]

    def continuations(self, pattern: Sequence[int]) -> dict[tuple[int, ...], int]:
        """Every continuation ``w`` (length >= 1) of ``pattern`` in the tree with ``count(pattern + w)``."""
        start = self.find(pattern)
        out: dict[tuple[int, ...], int] = {}
        stack = [((), start)] if start is not None else []
        while stack:
            prefix, node = stack.pop()
            for tok, child in self._items(node):
                out[prefix + (tok,)] = self._count[child]
                stack.append((prefix + (tok,), child))
        return out

    def speculate(
        self,
        pattern: Sequence[int],
        max_spec_tokens: int,
        max_spec_factor: float = 1.0,
        max_spec_offset: float = 0.0,
        min_token_prob: float = 0.1,
        tree: bool = True,
        nodes: Sequence[int] | None = None,
    ) -> SuffixCandidate:
        """The best-scoring candidate over all match lengths of ``pattern``'s suffixes (module docstring; of equal
        scores, the one of the larger score bound, then the longer match); ``tree``: a tree grown best-first, else the
        single path of the most frequent child at each step. ``nodes``: the nodes of the pattern's suffixes of length
        1, 2, .. that occur (:meth:`match_nodes`), when the caller has them."""
        best = SuffixCandidate()
        if nodes is not None:
            low = min(len(nodes), len(pattern), self.max_depth - 1)
        else:  # the longest suffix of the pattern that occurs (a match of max_depth tokens has no continuation), by
            # bisection: a suffix that does not occur has no longer suffix that does
            low, high = 0, min(len(pattern), self.max_depth - 1)
            while low < high:
                mid = (low + high + 1) // 2
                if self.find(pattern[len(pattern) - mid :]) is not None:
                    low = mid
                else:
                    high = mid - 1
        grow = self._grow_tree if tree else self._grow_path
        # a candidate of match length L scores at most its size bound and at most one per level below the match (the
        # confidences of one level sum to <= 1), of which there are max_depth - L: try the lengths by that bound,
        # largest first (then the longer match), and stop once no bound beats the best score found
        bounds = []
        for length in range(1, low + 1):
            budget = min(int(max_spec_tokens), int(length * max_spec_factor + max_spec_offset + 1e-9))
            bounds.append((min(budget, self.max_depth - length), length, budget))
        bounds.sort(key=lambda b: (-b[0], -b[1]))
        for bound, length, budget in bounds:
            if bound <= best.score:
                break
            match = nodes[length - 1] if nodes is not None else self.find(pattern[len(pattern) - length :])
            candidate = grow(match, budget, min_token_prob)
            if candidate.tokens and candidate.score > best.score:
                candidate.match_len = length
                best = candidate
        return best

    def _grow_tree(self, match: int, budget: int, min_prob: float) -> SuffixCandidate:
        out = SuffixCandidate()
        count, last, token, first, nxt = self._count, self._last, self._token, self._first, self._next
        total = count[match]
        heap: list[tuple[float, int, int, int, int]] = []  # (-confidence, tie, parent index, token, node)
        tie = 0
        for tok, child in self._items(match):
            heapq.heappush(heap, (-count[child] / total, tie, -1, tok, child))
            tie += 1
        tokens, parents, probs = out.tokens, out.parents, out.probs
        while heap and len(tokens) < budget:
            neg, _, parent, tok, node = heapq.heappop(heap)
            if -neg < min_prob:
                break
            index = len(tokens)
            tokens.append(tok)
            parents.append(parent)
            probs.append(-neg)
            out.sources.add(last[node])
            child = first[node]
            if child >= 0 and nxt[child] < 0:  # one child (most nodes): no list of children
                heapq.heappush(heap, (-count[child] / total, tie, index, token[child], child))
                tie += 1
            elif child >= 0:
                for ctok, child in self._items(node):
                    heapq.heappush(heap, (-count[child] / total, tie, index, ctok, child))
                    tie += 1
        out.score = float(sum(probs))
        return out

    def _grow_path(self, match: int, budget: int, min_prob: float) -> SuffixCandidate:
        out = SuffixCandidate()
        count = self._count
        total = count[match]
        first, nxt, token = self._first, self._next, self._token
        node = match
        while len(out.tokens) < budget:
            child = first[node]
            if child < 0:
                break
            if nxt[child] < 0:  # one child (most nodes)
                tok = token[child]
            else:
                tok, child = max(self._items(node), key=lambda kv: count[kv[1]])  # first of equal counts
            prob = count[child] / total
            if prob < min_prob:
                break
            out.parents.append(len(out.tokens) - 1)
            out.tokens.append(tok)
            out.probs.append(prob)
            out.sources.add(self._last[child])
            node = child
        out.score = float(sum(out.probs))
        return out


class SuffixCache:
    """The global suffix tree over finished outputs, with bounded memory and LRU eviction of whole outputs.

    ``max_requests``: most outputs held (0: none, the cache is off); ``capacity``: most entries (trie nodes plus
    stored tokens, :attr:`SuffixTree.memory`; about 130 bytes each on CPython) held after every insertion. An output
    that alone needs more than ``capacity`` is not kept."""

    def __init__(self, max_depth: int = 24, max_requests: int = 10_000, capacity: int = 2_000_000):
        self.tree = SuffixTree(max_depth)
        self.max_requests = _check_int("max_requests", max_requests, 0)
        self.capacity = _check_int("capacity", capacity, 1)
        self._recent: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self._next_id = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._recent)

    @property
    def memory(self) -> int:
        return self.tree.memory

    def insert(self, tokens: Sequence[int]) -> int | None:
        """Cache one finished output; returns its id (None: the cache is off or the output is empty)."""
        if self.max_requests == 0 or not tokens:
            return None
        seq_id = self._next_id
        self._next_id += 1
        self.tree.extend(seq_id, tokens)
        self.tree.seal(seq_id)
        self._recent[seq_id] = None
        while len(self._recent) > self.max_requests or self.tree.memory > self.capacity:
            oldest, _ = self._recent.popitem(last=False)
            self.tree.remove(oldest)
            self.evicted += 1
        return seq_id if seq_id in self._recent else None

    def touch(self, seq_ids: Iterable[int]) -> None:
        """Mark outputs as just used (those still cached)."""
        for seq_id in seq_ids:
            if seq_id in self._recent:
                self._recent.move_to_end(seq_id)

    def speculate(self, pattern: Sequence[int], *args, **kwargs) -> SuffixCandidate:
        """:meth:`SuffixTree.speculate` on the cached outputs; the outputs the candidate was read from are used."""
        if not self._recent:
            return SuffixCandidate()
        candidate = self.tree.speculate(pattern, *args, **kwargs)
        self.touch(candidate.sources)
        return candidate


class SuffixDrafter:
    """Suffix decoding (module docstring): per request, a suffix tree over its prompt and committed output; a global
    :class:`SuffixCache` over finished outputs (inserted when the next request is admitted); each step the
    better-scoring candidate of the two, as a tree (chains: the most frequent path) whose confidences are empirical
    frequencies.

    ``max_depth``: depth of the trees (the longest pattern matched plus its continuation); ``max_spec_tokens``: most
    draft tokens (None: the engine's budget); ``max_spec_factor`` / ``max_spec_offset``: a match of length L drafts at
    most ``floor(factor * L + offset)`` tokens (the defaults, 3 and 1, draft further than the length-for-length rule
    of the public engines: the budget cuts each draft to the tree size that pays); ``min_token_prob``: least path
    confidence drafted; ``max_cached_requests`` / ``cache_capacity``: the global cache's bounds (0 requests: no
    global cache); ``cache``: a :class:`SuffixCache` to share (e.g. across engines), instead of a new one."""

    name = "suffix"
    description = ("suffix decoding: frequency-scored trees from suffix trees over the request's tokens and earlier "
                   "outputs (no model)")
    synthetic = False
    runs_model = False  # tensor parallel: proposes on rank 0 only (engine.stepplan)

    def __init__(
        self,
        max_depth: int = 24,
        max_spec_tokens: int | None = None,
        max_spec_factor: float = 3.0,
        max_spec_offset: float = 1.0,
        min_token_prob: float = 0.1,
        max_cached_requests: int = 10_000,
        cache_capacity: int = 2_000_000,
        cache: SuffixCache | None = None,
    ):
        self.max_depth = _check_int("max_depth", max_depth, 2)
        self.max_spec_tokens = None if max_spec_tokens is None else _check_int("max_spec_tokens", max_spec_tokens, 1)
        for name, value in (("max_spec_factor", max_spec_factor), ("max_spec_offset", max_spec_offset)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
                raise ValueError(f"{name} = {value!r} must be a finite number")
        if max_spec_factor < 0:
            raise ValueError(f"max_spec_factor = {max_spec_factor!r} must be >= 0")
        if isinstance(min_token_prob, bool) or not isinstance(min_token_prob, (int, float)) \
                or not 0 <= min_token_prob <= 1:
            raise ValueError(f"min_token_prob = {min_token_prob!r} must lie in [0, 1]")
        self.max_spec_factor, self.max_spec_offset = float(max_spec_factor), float(max_spec_offset)
        self.min_token_prob = float(min_token_prob)
        if cache is not None and cache.tree.max_depth != self.max_depth:
            raise ValueError(f"cache has max_depth {cache.tree.max_depth}, the drafter {self.max_depth}: want equal")
        self.cache = cache if cache is not None else SuffixCache(self.max_depth, max_cached_requests, cache_capacity)
        self._local: dict[int, SuffixTree] = {}
        self._prompt_len: dict[int, int] = {}
        self._finished: list[list[int]] = []  # released outputs not yet in the global cache (flush_finished)
        self._waiting: dict[int, list[int]] = {}  # slot -> committed tokens not yet in its tree (advance)
        self.picks = {"local": 0, "global": 0, "none": 0}  # which tree each proposal came from

    def admit(self, slot: int, prompt: Sequence[int]) -> None:
        self.flush_finished()
        tree = SuffixTree(self.max_depth)
        tree.extend(0, prompt)
        self._local[slot] = tree
        self._prompt_len[slot] = len(prompt)

    def advance(self, requests: Sequence[DraftRequest], committed: Sequence[Sequence[int]]) -> None:
        """The tokens of the step before go into the requests' trees; this step's wait for the next call or the next
        :meth:`propose`, whichever comes first. A decoded step calls this while the device decodes, so the tokens of
        a verified step before it are taken in then, off the critical path; a proposal always sees every committed
        token."""
        self._take_in()
        for r, new in zip(requests, committed):
            self._waiting.setdefault(r.slot, []).extend(int(t) for t in new)

    def _take_in(self, slots: Iterable[int] | None = None) -> None:
        """Extend the trees of ``slots`` (None: every slot) by their waiting tokens."""
        for slot in list(self._waiting) if slots is None else slots:
            tokens = self._waiting.pop(slot, None)
            if tokens:
                self._local[slot].extend(0, tokens)

    def release(self, slot: int) -> None:
        """The request's own tree is dropped; its committed output joins the global cache at the next admission
        (:meth:`flush_finished`): a step that ends requests does not pay for their insertion (about a millisecond
        for 150 tokens), the prefill of the next request does."""
        self._take_in([slot])
        tree = self._local.pop(slot, None)
        if tree is not None:
            self._finished.append(tree.sequences[0][self._prompt_len.pop(slot):])

    def flush_finished(self) -> None:
        """Insert the outputs of the requests released since the last call into the global cache."""
        while self._finished:
            self.cache.insert(self._finished.pop(0))

    def candidate(self, slot: int, context: Sequence[int], max_tokens: int, chain: bool) -> SuffixCandidate:
        """The better-scoring candidate of the request's tree and the global cache for ``context`` (prompt + output,
        the pending token last); ties go to the request's own tree."""
        pattern = context[-(self.max_depth - 1):]
        args = (max_tokens, self.max_spec_factor, self.max_spec_offset, self.min_token_prob, not chain)
        self._take_in([slot])
        tree = self._local[slot]
        nodes = None
        if len(tree.sequences[0]) == len(context) - 1:  # the tree holds the context but its pending token: its
            nodes = tree.match_nodes(0, context[-1])  # growth state has the pattern's suffixes
        local = tree.speculate(pattern, *args, nodes=nodes)
        shared = self.cache.speculate(pattern, *args)
        best, source = (shared, "global") if shared.score > local.score else (local, "local")
        self.picks[source if best.tokens else "none"] += 1
        return best

    def propose(self, requests: Sequence[DraftRequest], max_nodes: int, chain: bool) -> list[Draft]:
        limit = max_nodes - 1 if self.max_spec_tokens is None else min(max_nodes - 1, self.max_spec_tokens)
        drafts = []
        for r in requests:
            c = self.candidate(r.slot, r.context, limit, chain) if limit > 0 else SuffixCandidate()
            drafts.append(Draft([int(r.context[-1])] + c.tokens, [-1] + [p + 1 for p in c.parents],
                                np.array([1.0] + c.probs), best_first=True))
        return drafts
