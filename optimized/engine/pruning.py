r"""Confidence pruning: cut a draft tree to the budget's node count by path confidence (shared by every drafter).

A drafter reports, per node u, a *path confidence* ``c(u)``: its estimate that the whole path root..u is accepted.
Acceptance of u needs acceptance of its parent, so the confidence that can be used is the running minimum along the
path, ``c*(u) = min(c(u), c*(parent(u)))`` (equal to ``c`` for any drafter whose confidences never increase along a
path, as all of ours do). Pruning to ``N`` nodes keeps the root and the ``N - 1`` non-root nodes of highest ``c*``
(ties to the lower index), optionally only nodes no deeper than ``max_depth``.

The kept set is a tree: a parent has ``c* >=`` its child's and a lower index (parents precede children), so it ranks
before the child in the order ``(-c*, index)``, and it is no deeper. The expected number of accepted draft tokens of
a tree is the sum of its nodes' path acceptance probabilities, so among the subtrees of ``N`` nodes this one has the
largest sum of confidences: the one the budget's expected-tokens estimate (the sum of the kept confidences) ranks
highest.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["path_confidences", "prune_indices"]


def _depths(parents: Sequence[int]) -> np.ndarray:
    depth = np.zeros(len(parents), dtype=np.int64)  # [n]
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    return depth


def path_confidences(parents: Sequence[int], confidence: Sequence[float]) -> np.ndarray:
    """``c*``: each node's confidence capped by its ancestors' (the running minimum along the path; ``c*[0] = 1``).
    ``parents`` must be topological (``parents[0] = -1``, ``0 <= parents[i] < i``)."""
    conf = np.asarray(confidence, dtype=np.float64).copy()  # [n]
    if len(parents) != len(conf) or len(conf) < 1:
        raise ValueError(f"parents has {len(parents)} entries and confidence {len(conf)}: want the same number >= 1")
    conf[0] = 1.0
    for i in range(1, len(conf)):
        p = parents[i]
        if not 0 <= p < i:
            raise ValueError(f"parents[{i}] = {p}: parents must precede their children (0 <= parent < index)")
        if conf[p] < conf[i]:
            conf[i] = conf[p]
    return conf


def prune_indices(
    parents: Sequence[int], confidence: Sequence[float], nodes: int, max_depth: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The nodes kept by pruning to ``nodes`` nodes (module docstring): ``(kept indices, ascending, root first;
    their path confidences c*)``. ``nodes >= 1``; ``max_depth``: the deepest depth kept (None: any)."""
    if isinstance(nodes, bool) or not isinstance(nodes, (int, np.integer)) or nodes < 1:
        raise ValueError(f"nodes = {nodes!r} must be an integer >= 1")
    if max_depth is not None and max_depth < 0:
        raise ValueError(f"max_depth = {max_depth!r} must be >= 0 (or None)")
    conf = path_confidences(parents, confidence)  # [n]
    n = len(conf)
    candidates = np.arange(1, n)  # [n - 1]
    if max_depth is not None:
        candidates = candidates[_depths(parents)[1:] <= max_depth]
    if len(candidates) > nodes - 1:
        order = np.lexsort((candidates, -conf[candidates]))  # by (-c*, index)
        candidates = np.sort(candidates[order[: nodes - 1]])
    kept = np.concatenate([[0], candidates]).astype(np.int64)  # [k]
    return kept, conf[kept]
