r"""The unit-lower-triangular solve of the tree closed form, in the schedules the project uses.

The closed form (:func:`~lumotree.reference.gdn.tree_closed_form`) solves ``(I + A) Delta = B`` where ``A`` is
supported on the strict ancestor mask ``M°`` (``A_ij != 0`` only if j is a strict ancestor of i). Three schedules
compute the same ``Delta``:

- ``"substitution"``: forward substitution, row i subtracting only the rows of i's ancestors (the reference's own);
- ``"doubling"``: ``T = (I + A)^{-1} = prod_{l < L} (I + (-A)^(2^l))`` with ``L = bit_length(max depth)`` factors,
  then ``Delta = T B`` (the GPU kernels' solve). ``A^(depth + 1) = 0`` (a nonzero entry of ``A^m`` needs a chain of m
  strict-ancestor steps), and ``(I + A) prod_{l < L} (I + (-A)^(2^l)) = I - (-A)^(2^L)`` with ``2^L > depth``;
- ``"halves"``: the inverse by diagonal halves at a split ``h`` (the kernels' past 64 padded nodes, ``h`` = half the
  padded size): ``A_12 = 0`` (ancestors come first), ``T = [[T_11, 0], [-T_22 A_21 T_11, T_22]]`` with each
  ``T_ii = (I + A_ii)^{-1}`` by doubling with the whole tree's ``L`` (a diagonal block holds parts of root paths, so
  ``A_ii^(depth + 1) = 0`` too).

Every function runs on float64 arrays and on object arrays of ``Fraction``, sympy or z3 elements (no division).
``lumotree.proofs`` checks each schedule's inverse on symbolic ``A`` (``nilpotent/sympy``) and the closed form with
each schedule against the recurrence.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .tree import TokenTree, check_tree

__all__ = [
    "SCHEDULES",
    "doubling_levels",
    "halves_split",
    "inverse_by_doubling",
    "inverse_by_halves",
    "forward_substitution",
    "solve_unit_lower",
]

SCHEDULES = ("substitution", "doubling", "halves")


def doubling_levels(max_depth: int) -> int:
    """``L = bit_length(max_depth)``: the number of doubling factors, the least L with ``2^L > max_depth``."""
    if isinstance(max_depth, bool) or not isinstance(max_depth, (int, np.integer)) or max_depth < 0:
        raise ValueError(f"max_depth = {max_depth!r} must be a non-negative integer")
    return int(max_depth).bit_length()


def halves_split(num_nodes: int) -> int:
    """The kernels' split of an ``N``-node tree: half the padded size ``NP = next_power_of_2(N)``; ``1 <= h < N`` for
    ``N >= 2``."""
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, (int, np.integer)) or num_nodes < 2:
        raise ValueError(f"num_nodes = {num_nodes!r} must be an integer >= 2 to split into halves")
    return (1 << (int(num_nodes) - 1).bit_length()) // 2


def _identity(n: int, like: np.ndarray) -> np.ndarray:
    eye = np.eye(n, dtype=np.int64)
    return eye.astype(object) if like.dtype == object else eye.astype(np.float64)


def inverse_by_doubling(A: np.ndarray, levels: int) -> np.ndarray:
    """``prod_{l < levels} (I + (-A)^(2^l))`` for a square ``A: [n, n]``, in the kernels' order: ``P_0 = -A``,
    ``T_1 = I + P_0``; then for ``l = 1 .. levels - 1``: ``P_l = P_(l-1) P_(l-1)``, ``T_(l+1) = T_l + T_l P_l``.
    Equals ``(I + A)^{-1}`` whenever ``A^(2^levels) = 0``. ``levels = 0`` gives ``I``."""
    A = np.asarray(A)
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"A has shape {A.shape}, expected a square [n, n] matrix")
    eye = _identity(A.shape[0], A)
    if levels == 0:
        return eye
    power = -A  # [n, n] P_0
    inverse = eye + power  # [n, n] T_1
    for _ in range(1, levels):
        power = power @ power  # P_l
        inverse = inverse + inverse @ power  # T_(l+1)
    return inverse


def inverse_by_halves(A: np.ndarray, levels: int, split: int) -> np.ndarray:
    """``(I + A)^{-1}`` from the diagonal blocks at ``split``: ``[[T_11, 0], [-T_22 A_21 T_11, T_22]]`` with each
    ``T_ii`` :func:`inverse_by_doubling` of ``A_ii`` with ``levels`` factors. The upper block ``A_12`` is not read, as
    in the kernels: it is zero when the nodes are in topological order (ancestors precede)."""
    A = np.asarray(A)
    n = A.shape[0]
    if not 1 <= split < n:
        raise ValueError(f"split = {split} must lie in [1, {n})")
    t11 = inverse_by_doubling(A[:split, :split], levels)  # [h, h]
    t22 = inverse_by_doubling(A[split:, split:], levels)  # [n - h, n - h]
    inverse = _identity(n, A) * 0  # [n, n]
    inverse[:split, :split] = t11
    inverse[split:, split:] = t22
    inverse[split:, :split] = -(t22 @ A[split:, :split] @ t11)
    return inverse


def forward_substitution(A: np.ndarray, rhs: np.ndarray, tree: TokenTree) -> np.ndarray:
    """``X`` with ``(I + A) X = rhs`` (``rhs: [N, V]``): row i is ``rhs_i - sum_{j strict ancestor of i} A_ij X_j``,
    rows in topological order (ancestors first)."""
    tree = check_tree(tree)
    rows = np.empty_like(rhs)  # [N, V]
    for i in range(tree.num_nodes):
        acc = rhs[i]
        for j in tree.path(i)[:-1]:
            acc = acc - rows[j] * A[i, j]
        rows[i] = acc
    return rows


def solve_unit_lower(A: np.ndarray, rhs: np.ndarray, tree: TokenTree, schedule: str = "substitution") -> np.ndarray:
    """``(I + A)^{-1} rhs`` for ``A: [N, N]`` on the strict ancestor mask of ``tree``, by ``schedule`` (one of
    :data:`SCHEDULES`); ``"halves"`` on a one-node tree is the doubling."""
    tree = check_tree(tree)
    if schedule == "substitution":
        return forward_substitution(A, rhs, tree)
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule = {schedule!r} is not one of {SCHEDULES}")
    levels = doubling_levels(tree.max_depth)
    if schedule == "halves" and tree.num_nodes >= 2:
        inverse = inverse_by_halves(A, levels, halves_split(tree.num_nodes))
    else:
        inverse = inverse_by_doubling(A, levels)
    return inverse @ rhs
