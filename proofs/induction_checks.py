"""Every tree size: the induction step of the closed form and the commit, and the doubling solve for any width.

``induction/sympy`` proves, with block-matrix symbols (sympy's noncommutative symbols: each stands for a matrix of
any size, and products keep their order), the step of the induction in ``docs/closed-form.md``: for a node ``l``
whose parent p has an ancestor path P of *any* length m (a block), if p's state has the closed form

    S_p = Gamma_p S0 + K_P^T E_P Delta_P          (K_P: [m, K] keys, Delta_P: [m, V] factors, E_P: [m, m] weights)

then the closed form's rules for ``l`` (the row of the triangular solve over ancestors only, the output with the
inclusive mask, the commit) give exactly what one recurrence step from S_p gives:

- ``delta_l`` (the solve's row: ``beta (v^T - Gamma_l k^T S0) - A_l,P Delta_P`` with ``A_l,P = beta alpha k^T K_P^T
  E_P``) equals the recurrence's ``beta (v^T - alpha k^T S_p)``;
- ``o_l = scale (Gamma_l q^T S0 + q^T K_P^T (alpha E_P) Delta_P + q^T k delta_l)`` equals ``scale q^T S_l``;
- the commit ``Gamma_l S0 + K_P^T (alpha E_P) Delta_P + k delta_l`` equals ``S_l = alpha (I - beta k k^T) S_p +
  beta k v^T``, and it is again of the hypothesis' form for the path P + l (weights ``diag(alpha E_P, 1)``).

With the base case (the root: m = 0, ``S_parent = S0``, ``Gamma = 1``) induction over the topological order gives the
closed form and the commit for every tree of every size. The bounded checks (``closed-form/*``, ``commit/*``,
``deep/fractions``) show that the reference code applies exactly these rules.

``nilpotent/blocks`` runs the reference's own ``inverse_by_doubling`` on a strictly block-lower-triangular matrix of
noncommutative blocks ``A_ij`` (rows and columns grouped by depth: a tree's A only links a node to its strict
ancestors, which are shallower), with ``doubling_levels(d)`` factors, and proves ``(I + A) T = T (I + A) = I``: the
doubling solve inverts ``I + A`` for every tree of depth at most d, whatever its number of nodes (the product is a
polynomial in A, so regrouping the nodes by depth does not change it). ``doubling_levels`` is checked to be the least
L with ``2^L > d`` for every depth below 2^16.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .core import Context, Outcome, check

DOCS = "closed-form.md"
BLOCK_DEPTHS = {"quick": 10, "full": 15}
LEVELS_CHECKED_BELOW = 1 << 16


def _symbols(names: str, commutative: bool) -> list[Any]:
    import sympy

    return [sympy.Symbol(name, commutative=commutative) for name in names.split()]


def induction_step(m_is_empty: bool) -> dict[str, tuple[Any, Any]]:
    """``name -> (closed form, recurrence)`` for one leaf below a parent with a block path (empty for the root)."""
    S0, k, kT, vT, qT, KPT, EP, DP = _symbols("S0 k kT vT qT KPT EP DP", commutative=False)
    alpha, beta, gamma_p, scale = _symbols("alpha beta Gamma_p scale", commutative=True)
    if m_is_empty:  # the root: its parent state is S0 itself (Gamma = 1, no path)
        KPT, gamma_p = 0 * KPT, 1
    S_p = gamma_p * S0 + KPT * EP * DP  # the hypothesis for the parent
    gamma_l = alpha * gamma_p
    # the closed form's rules for the leaf
    A_row = beta * alpha * kT * KPT * EP  # [1, m]: beta_l (k_l . k_j) D_lj, D_lj = alpha_l (Gamma_p / Gamma_j)
    delta = beta * (vT - gamma_l * kT * S0) - A_row * DP  # forward substitution over the ancestors only
    output = scale * (gamma_l * qT * S0 + qT * KPT * (alpha * EP) * DP + qT * k * delta)  # D_ll = 1
    committed = gamma_l * S0 + KPT * (alpha * EP) * DP + k * delta
    # one recurrence step from the parent
    S_l = alpha * (S_p - beta * k * kT * S_p) + beta * k * vT
    return {
        "delta_l = beta (v^T - alpha k^T S_p)": (delta, beta * (vT - alpha * kT * S_p)),
        "o_l = scale q^T S_l": (output, scale * qT * S_l),
        "commit(l) = S_l": (committed, S_l),
    }


@check(
    "induction/sympy",
    claim="closed form (solve row, output) and commit of a node below an ancestor path of any length equal one "
    "recurrence step from its parent's closed-form state: with the root case, every tree of every size",
    docs=DOCS,
)
def induction(ctx: Context) -> Outcome:
    import sympy

    scope = {
        "trees": "every tree of every size (induction over the topological order: the root, then a node below a path "
        "of any length m)",
        "dims": "K, V, m arbitrary: S0, k, q, v, the path's keys K_P, factors Delta_P and weights E_P are block "
        "symbols",
        "numbers": "sympy noncommutative symbols for the blocks (products keep their order), commutative scalars "
        "alpha, beta, Gamma_p, scale; equal iff the expanded difference is 0 in the free algebra",
    }
    for case in ctx.cases(("root", "below a path"), note="base and step"):
        for claim, (closed, recurrence) in induction_step(case == "root").items():
            difference = sympy.expand(closed - recurrence)
            if difference != 0:
                return Outcome("refuted", scope, detail=f"{case}: {claim} fails",
                               counterexample={"case": case, "claim": claim, "difference": str(difference)})
    return Outcome("proved", scope, detail="base case and induction step: delta, output and commit of the closed form "
                   "= one recurrence step")


@check(
    "nilpotent/blocks",
    claim="the reference's doubling solve with doubling_levels(d) factors inverts I + A for every tree of depth at "
    "most d, any number of nodes",
    docs=DOCS,
    weight=4,
)
def doubling_any_width(ctx: Context) -> Outcome:
    import sympy

    solve = ctx.ref.need("solve")
    max_depth = BLOCK_DEPTHS["quick" if ctx.quick else "full"]
    scope = {
        "trees": f"every tree of depth 0..{max_depth}, any number of nodes (nodes grouped by depth)",
        "dims": "A: [d + 1, d + 1] blocks, A_ij a noncommutative symbol for every depth i > j, 0 elsewhere",
        "numbers": "sympy noncommutative symbols; doubling_levels also on every depth below 2^16 (exact ints)",
    }
    for d in range(LEVELS_CHECKED_BELOW):
        levels = solve.doubling_levels(d)
        if not (2**levels > d and (levels == 0 or 2 ** (levels - 1) <= d)):
            return Outcome("refuted", scope,
                           detail=f"doubling_levels({d}) = {levels} is not the least L with 2^L > {d}",
                           counterexample={"depth": d, "levels": levels})
    for d in ctx.cases(range(max_depth + 1), note="depths"):
        n = d + 1
        A = np.zeros((n, n), dtype=object)  # [d + 1, d + 1] blocks
        for i in range(n):
            for j in range(i):
                A[i, j] = sympy.Symbol(f"A_{i}_{j}", commutative=False)
        eye = np.eye(n, dtype=int).astype(object)
        T = np.asarray(solve.inverse_by_doubling(A, solve.doubling_levels(d)), dtype=object)
        for side, product in (("(I + A) T", (eye + A) @ T), ("T (I + A)", T @ (eye + A))):
            for idx in np.ndindex(n, n):
                if sympy.expand(product[idx] - eye[idx]) != 0:
                    return Outcome("refuted", scope, detail=f"{side} != I at block {idx} for depth {d}",
                                   counterexample={"depth": d, "levels": solve.doubling_levels(d), "block": list(idx),
                                                   "entry": str(sympy.expand(product[idx]))[:400]})
    return Outcome("proved", scope, detail=f"depths 0..{max_depth}: the doubling product is a two-sided inverse")
