r"""The hybrid prefix cache: a request whose prompt extends a cached prefix prefills only the new tokens.

A hybrid model's cache after ``p`` tokens is two things: the attention layers' K / V of every position ``< p`` (one
row per token: any prefix of them is the K / V of that prefix) and the GDN layers' recurrent and conv states *at*
``p`` (one value that sums up the whole prefix: it cannot be cut back to a shorter prefix). So the cache keeps

- **blocks**: the K / V rows of ``block_tokens`` consecutive tokens, chained: a block is keyed by the hash of its
  parent block's key and its own tokens, so a key names a whole block-aligned token prefix. A prefix shared by many
  requests (a system prompt, the earlier turns of a conversation) is stored once;
- **snapshots**: the GDN and conv states at one prefix length ``p``, hung on the block that ends at
  ``block_tokens * floor(p / block_tokens)`` with the ``tail`` tokens after it (and their K / V rows). Snapshots are
  taken at the last block boundary of each prompt, where each request ends (its whole prompt and output: the prefix
  the next turn of an agent conversation extends), and at the *junction*: the end of the cached blocks a prompt
  shares with earlier ones when no state is held there (a prompt that shares a system prompt with an earlier one
  prefills it once more and leaves the states at its end, so that every later prompt with it restores them).

:meth:`PrefixCache.match` finds the longest snapshot whose prefix ``tokens[:p]`` starts the new prompt (``p`` at most
``limit``, one token short of the prompt: its logits come from the prefill); the engine writes the blocks' K / V and
the snapshot's states into the request's slot and prefills ``tokens[p:]``. The tokens of every block and tail are
compared on a match, so a hash collision is a miss, never a wrong state.

**Memory**: the K / V and states live where the model's caches do (the GPU for the optimized model). Their bytes are
counted against ``budget_bytes``; past it the least recently used snapshot goes, and with it every block no
remaining snapshot needs (a block only serves the snapshots below it: K / V without the states at a later
position restore nothing in a hybrid model). A snapshot larger than the whole budget is not kept.

This is the scheme vLLM's hybrid prefix caching ("align" mode: states on a block grid) and SGLang's radix cache for
Mamba models (states at the end of cached sequences) use; a snapshot costs the states of every GDN layer, so they are
kept at two points a request rather than at every block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

__all__ = ["PrefixCache", "PrefixHit", "PrefixCacheStats", "Snapshot", "nbytes", "parse_size", "prefill", "keep",
           "supports_prefix_cache"]

_UNITS = {"": 1 << 20, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 1000**2,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30}


def parse_size(text: str) -> int:
    """Bytes of a size such as ``512MiB``, ``2GiB``, ``1.5G`` or ``0`` (a bare number is MiB). Raises ``ValueError``."""
    raw = str(text).strip().lower().replace(" ", "")
    number = raw.rstrip("kmgib")
    unit = raw[len(number):]
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"{text!r} is not a size (say 512MiB, 2GiB or 0)") from None
    if unit not in _UNITS or not np.isfinite(value) or value < 0:
        raise ValueError(f"{text!r} is not a size (say 512MiB, 2GiB or 0)")
    return int(value * _UNITS[unit])


def nbytes(obj: Any) -> int:
    """Bytes held by the tensors and arrays in ``obj`` (nested lists, tuples, dicts and dataclass-like objects)."""
    if obj is None:
        return 0
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(x) for x in obj)
    if isinstance(obj, dict):
        return sum(nbytes(x) for x in obj.values())
    if hasattr(obj, "__dict__"):
        return sum(nbytes(x) for x in vars(obj).values())
    return 0


@dataclass(eq=False)
class _Block:
    key: int
    parent: _Block | None
    tokens: tuple[int, ...]
    kv: Any  # the backend's K / V rows of these tokens
    size: int
    depth: int  # blocks from the root, this one included
    refs: int = 0  # child blocks and snapshots that need this block
    snapshots: dict[tuple[int, ...], Snapshot] = field(default_factory=dict)  # tail -> snapshot


@dataclass(eq=False)
class Snapshot:
    """The states after ``length`` tokens: the block chain up to ``block`` (None: the root), then ``tail``."""

    block: _Block | None
    tail: tuple[int, ...]
    tail_kv: Any
    state: Any
    length: int
    size: int


@dataclass
class PrefixHit:
    """What a slot needs to hold ``length`` tokens: ``kv`` the K / V rows as ``(start, end, rows)`` in order, and the
    recurrent and conv states at ``length``."""

    length: int
    kv: list[tuple[int, int, Any]]
    state: Any


@dataclass
class PrefixCacheStats:
    """Counts since the cache was made: lookups and the prompt tokens they covered, hits and the tokens they saved,
    snapshots stored and evicted, and the bytes held now."""

    queries: int = 0
    query_tokens: int = 0
    hits: int = 0
    hit_tokens: int = 0
    stored: int = 0
    evicted: int = 0
    bytes: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


class PrefixCache:
    """Blocks of K / V and snapshots of states under an LRU byte budget (module docstring).

    - ``budget_bytes``: most bytes of K / V and states held (``> 0``);
    - ``block_tokens``: tokens a block (the grid of prompt snapshots).
    """

    def __init__(self, budget_bytes: int, block_tokens: int = 64):
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, (int, np.integer)) or budget_bytes <= 0:
            raise ValueError(f"budget_bytes = {budget_bytes!r} must be a positive integer")
        if isinstance(block_tokens, bool) or not isinstance(block_tokens, (int, np.integer)) or block_tokens < 1:
            raise ValueError(f"block_tokens = {block_tokens!r} must be an integer >= 1")
        self.budget_bytes = int(budget_bytes)
        self.block_tokens = int(block_tokens)
        self.blocks: dict[int, _Block] = {}
        self.root: dict[tuple[int, ...], Snapshot] = {}  # snapshots shorter than one block
        self.lru: OrderedDict[int, Snapshot] = OrderedDict()  # id -> snapshot, least recently used first
        self.stats = PrefixCacheStats()

    # ------------------------------------------------------------------------------------------------ reading
    @staticmethod
    def _key(parent: _Block | None, tokens: tuple[int, ...]) -> int:
        return hash((parent.key if parent is not None else 0, tokens))

    def _walk(self, tokens: Sequence[int], limit: int) -> list[_Block]:
        """The cached blocks that start ``tokens[:limit]``, root first (tokens compared, not just hashes)."""
        bt, chain, parent = self.block_tokens, [], None
        for start in range(0, limit - bt + 1, bt):
            block_tokens = tuple(int(t) for t in tokens[start : start + bt])
            block = self.blocks.get(self._key(parent, block_tokens))
            if block is None or block.parent is not parent or block.tokens != block_tokens:
                break
            chain.append(block)
            parent = block
        return chain

    def match(self, tokens: Sequence[int], limit: int | None = None) -> PrefixHit | None:
        """The longest cached prefix ``tokens[:p]`` with ``p <= limit`` (default ``len(tokens)``), or None. A hit
        becomes the most recently used snapshot."""
        limit = len(tokens) if limit is None else min(int(limit), len(tokens))
        self.stats.queries += 1
        self.stats.query_tokens += max(limit, 0)
        if limit <= 0:
            return None
        chain = self._walk(tokens, limit)
        best: Snapshot | None = None
        for depth in range(len(chain), -1, -1):
            snapshots = chain[depth - 1].snapshots if depth else self.root
            start = depth * self.block_tokens
            for tail, snap in snapshots.items():
                end = start + len(tail)
                if end <= limit and (best is None or end > best.length) and \
                        tuple(int(t) for t in tokens[start:end]) == tail:
                    best = snap
            if best is not None:
                break  # a snapshot on a deeper block is longer than any on a shallower one
        if best is None:
            return None
        self.lru.move_to_end(id(best))
        self.stats.hits += 1
        self.stats.hit_tokens += best.length
        kv = [((b.depth - 1) * self.block_tokens, b.depth * self.block_tokens, b.kv) for b in chain[: self._depth(best)]]
        if best.tail:
            kv.append((best.length - len(best.tail), best.length, best.tail_kv))
        return PrefixHit(best.length, kv, best.state)

    @staticmethod
    def _depth(snap: Snapshot) -> int:
        return snap.block.depth if snap.block is not None else 0

    def held_blocks(self, tokens: Sequence[int], limit: int) -> int:
        """How many blocks of K / V that start ``tokens[:limit]`` are held (with or without states at their end)."""
        return len(self._walk(tokens, limit))

    def __len__(self) -> int:
        """Snapshots held."""
        return len(self.lru)

    def __contains__(self, tokens: Sequence[int]) -> bool:
        """Whether the states after exactly ``tokens`` are held."""
        chain = self._walk(tokens, len(tokens))
        depth = len(tokens) // self.block_tokens
        if len(chain) < depth:
            return False
        snapshots = chain[depth - 1].snapshots if depth else self.root
        return tuple(int(t) for t in tokens[depth * self.block_tokens:]) in snapshots

    # ------------------------------------------------------------------------------------------------ writing
    def insert(self, tokens: Sequence[int], read_kv: Callable[[int, int], Any], read_state: Callable[[], Any]) -> bool:
        """Keep the states after ``tokens`` (all the tokens a slot's cache holds). ``read_kv(start, end)`` returns the
        slot's K / V rows of positions ``[start, end)``, ``read_state()`` its states; only what is not held yet is
        read. Returns whether the snapshot is held (False: larger than the budget)."""
        tokens = [int(t) for t in tokens]
        if not tokens:
            return False
        bt = self.block_tokens
        depth = len(tokens) // bt
        chain = self._walk(tokens, depth * bt)
        block = chain[-1] if chain else None
        tail = tuple(tokens[depth * bt:])
        if len(chain) == depth:
            held = (block.snapshots if block is not None else self.root).get(tail)
            if held is not None:
                self.lru.move_to_end(id(held))
                return True
        new_blocks: list[_Block] = []
        parent = block
        for d in range(len(chain), depth):
            block_tokens = tuple(tokens[d * bt : (d + 1) * bt])
            if self._key(parent, block_tokens) in self.blocks:  # another prefix with the same hash: not kept
                return False
            kv = read_kv(d * bt, (d + 1) * bt)
            parent = _Block(self._key(parent, block_tokens), parent, block_tokens, kv, nbytes(kv), d + 1)
            new_blocks.append(parent)
        tail_kv = read_kv(depth * bt, len(tokens)) if tail else None
        state = read_state()
        snap = Snapshot(parent, tail, tail_kv, state, len(tokens), nbytes(tail_kv) + nbytes(state))
        if snap.size + sum(b.size for b in new_blocks) > self.budget_bytes:
            return False
        for b in new_blocks:
            if b.parent is not None:
                b.parent.refs += 1
            self.blocks[b.key] = b
            self.stats.bytes += b.size
        if parent is not None:
            parent.refs += 1
            parent.snapshots[tail] = snap
        else:
            self.root[tail] = snap
        self.lru[id(snap)] = snap
        self.stats.bytes += snap.size
        self.stats.stored += 1
        while self.stats.bytes > self.budget_bytes:
            self._evict(next(iter(self.lru.values())))
        return id(snap) in self.lru

    def _evict(self, snap: Snapshot) -> None:
        """Drop ``snap`` and every block that no snapshot needs any more."""
        del self.lru[id(snap)]
        self.stats.bytes -= snap.size
        self.stats.evicted += 1
        block = snap.block
        if block is None:
            del self.root[snap.tail]
            return
        del block.snapshots[snap.tail]
        block.refs -= 1
        while block is not None and block.refs == 0:
            del self.blocks[block.key]
            self.stats.bytes -= block.size
            block = block.parent
            if block is not None:
                block.refs -= 1

    def clear(self) -> None:
        """Drop every block and snapshot (the counts stay)."""
        while self.lru:
            self._evict(next(iter(self.lru.values())))


# ======================================================================================================= with a model
def prefill(model: Any, cache: PrefixCache, slot: int, prompt: Sequence[int]) -> tuple[torch.Tensor, int]:
    """Prefill ``prompt`` into ``slot`` of ``model`` (a :class:`~lumotree.optimized.engine.targets.TargetModel` with
    the prefix-cache methods) through ``cache``: the longest cached prefix (at most ``len(prompt) - 1`` tokens) is
    restored, the rest runs, and the states at the junction (the end of the held blocks it shares) and at the
    prompt's last block boundary are kept on the way. Returns the last logits ``[V]`` and the tokens restored."""
    P, bt = len(prompt), cache.block_tokens
    hit = cache.match(prompt, P - 1)
    start = 0
    if hit is not None:
        model.restore(slot, hit.kv, hit.state, hit.length)
        start = hit.length
    junction = cache.held_blocks(prompt, P - 1) * bt
    last = (P - 1) // bt * bt  # the last block boundary before the last token
    for mark in sorted({junction, last}):
        if mark > start:
            model.prefill(slot, prompt[start:mark], start)
            keep(model, cache, slot, prompt[:mark])
            start = mark
    return model.prefill(slot, prompt[start:], start), (hit.length if hit is not None else 0)


def keep(model: Any, cache: PrefixCache, slot: int, tokens: Sequence[int]) -> bool:
    """Keep the states of ``slot``, which holds ``tokens``, in ``cache`` (:meth:`PrefixCache.insert`)."""
    return cache.insert(tokens, lambda start, end: model.read_kv(slot, start, end), lambda: model.read_state(slot))


def supports_prefix_cache(model: Any) -> bool:
    """Whether ``model`` has what the prefix cache needs (``read_kv``, ``read_state``, ``restore``)."""
    return all(callable(getattr(model, name, None)) for name in ("read_kv", "read_state", "restore"))
