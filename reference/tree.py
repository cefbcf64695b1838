"""Draft token trees.

A tree of N nodes is a parent array in topological order: ``parents[0] == -1`` and ``0 <= parents[i] < i``.
Node 0 is the root (the pending token: sampled last, not yet run through the target); its parent is the committed
prefix. Node i sits at position ``prefix_len + depth(i)``. Siblings carry distinct tokens.

``M[i, j] = 1`` iff j is an ancestor of i or i itself (inclusive ancestor mask).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cached_property
from numbers import Integral

import numpy as np

__all__ = [
    "random_parents",
    "TokenTree",
    "ancestor_bits",
    "ancestor_row",
    "ancestor_words",
    "mask_bit",
    "child_depth",
    "node_position",
    "tree_slot",
    "validate_parents",
    "check_tree",
    "WORD_BITS",
]

WORD_BITS = 32


def validate_parents(parents: Sequence[int] | np.ndarray, name: str = "parents") -> tuple[int, ...]:
    """Check a parent array and return it as a tuple of Python ints.

    Raises ``ValueError`` naming the offending index: non-empty, integer entries, ``parents[0] == -1`` and
    ``0 <= parents[i] < i`` for ``i >= 1`` (topological order, single root).
    """
    if isinstance(parents, np.ndarray):
        if parents.ndim != 1:
            raise ValueError(f"{name} must be one-dimensional, got shape {parents.shape}")
        items = parents.tolist()
    else:
        items = list(parents)
    if len(items) == 0:
        raise ValueError(f"{name} must be non-empty (a tree has at least its root)")
    out: list[int] = []
    for i, p in enumerate(items):
        if isinstance(p, bool) or not isinstance(p, Integral):
            if isinstance(p, float) and float(p).is_integer():
                raise ValueError(f"{name}[{i}] = {p!r} is a float; parent indices must be integers")
            raise ValueError(f"{name}[{i}] = {p!r} is not an integer")
        p = int(p)
        if i == 0:
            if p != -1:
                raise ValueError(f"{name}[0] = {p} but the root's parent must be -1")
        elif not 0 <= p < i:
            raise ValueError(
                f"{name}[{i}] = {p} must satisfy 0 <= parent < {i} (topological order, one root at index 0)"
            )
        out.append(p)
    return tuple(out)


def check_tree(tree: object, name: str = "tree") -> TokenTree:
    """``tree`` itself if it is a :class:`TokenTree`, else ``TypeError`` naming ``name`` (a bare parent array is not
    accepted where a tree is expected: wrap it as ``TokenTree(parents)``)."""
    if not isinstance(tree, TokenTree):
        raise TypeError(f"{name} must be a TokenTree (e.g. TokenTree(parents)), got {type(tree).__name__}")
    return tree


def _tree_size(name: str, n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, Integral) or n < 1:
        raise ValueError(f"{name} = {n!r} must be a positive integer (a tree has at least its root)")
    return int(n)


def random_parents(n: int, rng: np.random.Generator, max_children: int = 4) -> list[int]:
    """Parents of a random ``n``-node tree in topological order: node i picks a uniform parent among 0..i-1 that has
    fewer than ``max_children`` children (the benchmarks' random tree)."""
    if n < 1 or max_children < 1:
        raise ValueError(f"n = {n} and max_children = {max_children} must be >= 1")
    parents, kids = [-1], [0]
    for i in range(1, n):
        while True:
            p = int(rng.integers(0, i))
            if kids[p] < max_children:
                break
        parents.append(p)
        kids[p] += 1
        kids.append(0)
    return parents


def ancestor_bits(parents: Sequence[int]) -> list[int]:
    """Inclusive ancestor bitsets: bit j of ``bits[i]`` is set iff j is an ancestor of i or i itself.

    ``bits[i] = bits[parents[i]] | (1 << i)``: one pass in topological order. The GPU kernels build the same bitset,
    stored as ``ceil(N / 32)`` 32-bit words per node, word ``j // 32``, bit ``j % 32``.
    """
    bits: list[int] = []
    for i, p in enumerate(parents):
        bits.append((bits[p] if p >= 0 else 0) | (1 << i))
    return bits


def ancestor_words(parents: Sequence[int], word_bits: int = WORD_BITS) -> list[list[int]]:
    """The kernels' layout of :func:`ancestor_bits`: ``[N][ceil(N / word_bits)]`` unsigned words.

    ``words[i] = words[parents[i]]`` with bit ``i % word_bits`` of word ``i // word_bits`` set. The GPU kernels build
    and read exactly this (see :func:`mask_bit`); ``lumotree.proofs`` checks the arithmetic with Z3.
    """
    n = len(parents)
    n_words = (n + word_bits - 1) // word_bits
    words: list[list[int]] = []
    for i, p in enumerate(parents):
        words.append(ancestor_row(words[p] if p >= 0 else [0] * n_words, i, word_bits))
    return words


def ancestor_row(parent_row, node, word_bits: int = WORD_BITS):
    """Row ``node`` of :func:`ancestor_words`: a copy of its parent's row (all zeros for the root) with bit
    ``node % word_bits`` of word ``node // word_bits`` set.

    Written with ``copy``, indexing and integer operators only, so ``lumotree.proofs`` runs this very function on Z3
    bit-vector terms (symbolic node, symbolic parent row) to prove the kernels' word arithmetic.
    """
    row = parent_row.copy()
    row[node // word_bits] |= 1 << (node % word_bits)
    return row


def mask_bit(words: Sequence[Sequence[int]], i: int, j: int, word_bits: int = WORD_BITS) -> int:
    """``M[i, j]`` read from the word layout: ``(words[i][j // word_bits] >> (j % word_bits)) & 1``."""
    return (words[i][j // word_bits] >> (j % word_bits)) & 1


def child_depth(parent_depth):
    """``depth(i) = depth(parent(i)) + 1``; the root has depth 0. One step of :attr:`TokenTree.depth`."""
    return parent_depth + 1


def node_position(prefix_len, depth):
    """The sequence position of a node at ``depth`` below the root, after ``prefix_len`` committed tokens:
    ``prefix_len + depth`` (its RoPE position, and the cache slot its K/V moves to when its path is committed)."""
    return prefix_len + depth


def tree_slot(prefix_len, node):
    """The cache slot a tree pass writes node ``node``'s K/V to, after ``prefix_len`` committed tokens:
    ``prefix_len + node`` (nodes in index order behind the committed cache)."""
    return prefix_len + node


class TokenTree:
    """A validated draft tree, optionally carrying a token id per node.

    ``TokenTree(parents)`` or ``TokenTree(parents, tokens)``; ``TokenTree.from_sequences(root_token, sequences)``
    builds the trie of several draft continuations (duplicate siblings merged).
    """

    __slots__ = ("parents", "tokens", "__dict__")

    def __init__(self, parents: Sequence[int] | np.ndarray, tokens: Sequence[int] | np.ndarray | None = None):
        self.parents: tuple[int, ...] = validate_parents(parents)
        if tokens is None:
            self.tokens: tuple[int, ...] | None = None
        else:
            token_list = tokens.tolist() if isinstance(tokens, np.ndarray) else list(tokens)
            if len(token_list) != len(self.parents):
                raise ValueError(f"tokens has {len(token_list)} entries but the tree has {len(self.parents)} nodes")
            for i, t in enumerate(token_list):
                if isinstance(t, bool) or not isinstance(t, Integral) or int(t) < 0:
                    raise ValueError(f"tokens[{i}] = {t!r} is not a non-negative integer token id")
            self.tokens = tuple(int(t) for t in token_list)
            seen: dict[tuple[int, int], int] = {}
            for i in range(1, len(self.parents)):
                key = (self.parents[i], self.tokens[i])
                if key in seen:
                    raise ValueError(
                        f"tokens[{i}] = {self.tokens[i]} repeats sibling {seen[key]} under parent {self.parents[i]};"
                        " siblings must carry distinct tokens"
                    )
                seen[key] = i

    # ---------------------------------------------------------------- construction
    @classmethod
    def chain(cls, n: int, tokens: Sequence[int] | None = None) -> TokenTree:
        """A single path of ``n >= 1`` nodes."""
        n = _tree_size("n", n)
        return cls([-1] + list(range(n - 1)), tokens)

    @classmethod
    def star(cls, n: int, tokens: Sequence[int] | None = None) -> TokenTree:
        """A root with ``n - 1`` children (``n >= 1``)."""
        n = _tree_size("n", n)
        return cls([-1] + [0] * (n - 1), tokens)

    @classmethod
    def from_sequences(cls, root_token: int, sequences: Iterable[Sequence[int]]) -> TokenTree:
        """The trie of draft continuations below ``root_token`` (the pending token); shared prefixes are merged."""
        parents = [-1]
        tokens = [int(root_token)]
        child_of: dict[tuple[int, int], int] = {}
        for s, seq in enumerate(sequences):
            node = 0
            for pos, tok in enumerate(seq):
                if isinstance(tok, bool) or not isinstance(tok, Integral) or int(tok) < 0:
                    raise ValueError(f"sequences[{s}][{pos}] = {tok!r} is not a non-negative integer token id")
                key = (node, int(tok))
                if key not in child_of:
                    child_of[key] = len(parents)
                    parents.append(node)
                    tokens.append(int(tok))
                node = child_of[key]
        return cls(parents, tokens)

    # ---------------------------------------------------------------- structure
    @property
    def num_nodes(self) -> int:
        return len(self.parents)

    def __len__(self) -> int:
        return len(self.parents)

    @cached_property
    def depth(self) -> np.ndarray:
        """``depth[i]``: number of edges from the root (root has depth 0). ``[N]`` int64."""
        d = np.zeros(self.num_nodes, dtype=np.int64)
        for i in range(1, self.num_nodes):
            d[i] = child_depth(d[self.parents[i]])
        return d

    @property
    def max_depth(self) -> int:
        return int(self.depth.max())

    @cached_property
    def ancestor_mask(self) -> np.ndarray:
        """Inclusive ancestor mask ``M[i, j] = 1`` iff j is on the root-to-i path. ``[N, N]`` bool, lower triangular."""
        n = self.num_nodes
        mask = np.zeros((n, n), dtype=bool)
        for i in range(n):
            p = self.parents[i]
            if p >= 0:
                mask[i] = mask[p]
            mask[i, i] = True
        return mask

    @cached_property
    def bits(self) -> tuple[int, ...]:
        """Inclusive ancestor bitsets (see :func:`ancestor_bits`)."""
        return tuple(ancestor_bits(self.parents))

    def path(self, node: int) -> list[int]:
        """Nodes from the root to ``node`` inclusive, root first."""
        node = self._check_node(node)
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def is_ancestor(self, j: int, i: int) -> bool:
        """True iff j is an ancestor of i or i itself."""
        return bool((self.bits[self._check_node(i)] >> self._check_node(j)) & 1)

    @cached_property
    def _children(self) -> tuple[tuple[int, ...], ...]:
        kids: list[list[int]] = [[] for _ in range(self.num_nodes)]
        for i in range(1, self.num_nodes):
            kids[self.parents[i]].append(i)
        return tuple(tuple(k) for k in kids)

    def children(self, node: int) -> tuple[int, ...]:
        """Children of ``node`` in index order."""
        return self._children[self._check_node(node)]

    @cached_property
    def leaves(self) -> tuple[int, ...]:
        """Nodes without children, in index order."""
        return tuple(i for i in range(self.num_nodes) if not self._children[i])

    def child_with_token(self, node: int, token: int) -> int | None:
        """The child of ``node`` carrying ``token``, or None."""
        if self.tokens is None:
            raise ValueError("this tree carries no tokens")
        for c in self.children(node):
            if self.tokens[c] == token:
                return c
        return None

    def _check_node(self, node: int) -> int:
        if isinstance(node, bool) or not isinstance(node, Integral) or not 0 <= int(node) < self.num_nodes:
            raise ValueError(f"node = {node!r} is not a node index in [0, {self.num_nodes})")
        return int(node)

    # ---------------------------------------------------------------- misc
    def __eq__(self, other: object) -> bool:
        return isinstance(other, TokenTree) and self.parents == other.parents and self.tokens == other.tokens

    def __hash__(self) -> int:
        return hash((self.parents, self.tokens))

    def __repr__(self) -> str:
        if self.tokens is None:
            return f"TokenTree(parents={list(self.parents)})"
        return f"TokenTree(parents={list(self.parents)}, tokens={list(self.tokens)})"

    def render(self, labels: Sequence[str] | None = None) -> str:
        """An indented text drawing of the tree (one node a line); ``labels``: one string per node."""
        if labels is not None:
            if isinstance(labels, (str, bytes)) or not isinstance(labels, Sequence):
                raise TypeError(f"labels must be a sequence of one label per node, got {type(labels).__name__}")
            if len(labels) != self.num_nodes:
                raise ValueError(f"labels has {len(labels)} entries but the tree has {self.num_nodes} nodes")
        lines: list[str] = []

        def walk(node: int, prefix: str, last: bool, top: bool) -> None:
            label = labels[node] if labels is not None else (
                f"{node}" if self.tokens is None else f"{node}:{self.tokens[node]}"
            )
            lines.append(label if top else prefix + ("└─ " if last else "├─ ") + label)
            kids = self.children(node)
            for k, c in enumerate(kids):
                walk(c, "" if top else prefix + ("   " if last else "│  "), k == len(kids) - 1, False)

        walk(0, "", True, True)
        return "\n".join(lines)
