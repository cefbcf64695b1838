"""Shared hypothesis strategies and exact-number / statistics helpers for the test suite.

``trees(max_nodes)`` draws parent arrays of every shape family the guide asks for: single node, chain, star,
deep+wide, and uniformly random topological trees.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import strategies as st

TREE_KINDS = ("single", "chain", "star", "deep_wide", "random")


def build_tree_parents(kind: str, n: int, rng: np.random.Generator) -> list[int]:
    """A parent array of ``n`` nodes of the given shape family."""
    if kind == "single" or n == 1:
        return [-1]
    if kind == "chain":
        return [-1] + list(range(n - 1))
    if kind == "star":
        return [-1] + [0] * (n - 1)
    if kind == "deep_wide":
        # a spine of about half the nodes, the rest hang as wide fans off random spine nodes
        spine = max(1, n // 2)
        parents = [-1] + list(range(spine - 1))
        while len(parents) < n:
            parents.append(int(rng.integers(0, spine)))
        return parents
    return [-1] + [int(rng.integers(0, i)) for i in range(1, n)]


@st.composite
def trees(draw, max_nodes: int = 12, min_nodes: int = 1) -> list[int]:
    kind = draw(st.sampled_from(TREE_KINDS))
    n = 1 if kind == "single" else draw(st.integers(min_value=max(min_nodes, 2), max_value=max(max_nodes, 2)))
    seed = draw(st.integers(min_value=0, max_value=2**32 - 1))
    return build_tree_parents(kind, n, np.random.default_rng(seed))


def to_fractions(x: np.ndarray, denominator: int = 64) -> np.ndarray:
    """Round floats to nearby fractions with small denominators: an exact object array."""
    return np.vectorize(lambda t: Fraction(round(float(t) * denominator), denominator), otypes=[object])(x)


def random_gdn_inputs(rng: np.random.Generator, N: int, H: int, HV: int, K: int, V: int, exact: bool):
    """Random GDN inputs (q, k, v, alpha, beta, S0); alpha in (0, 1], beta in [0, 2]."""
    q = rng.standard_normal((N, H, K))
    k = rng.standard_normal((N, H, K))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((N, HV, V))
    alpha = rng.uniform(0.2, 1.0, (N, HV))
    beta = rng.uniform(0.0, 2.0, (N, HV))
    S0 = rng.standard_normal((HV, K, V))
    if not exact:
        return q, k, v, alpha, beta, S0
    alpha_fr = np.vectorize(lambda t: Fraction(max(1, round(t * 64)), 64), otypes=[object])(alpha)
    beta_fr = np.vectorize(lambda t: Fraction(round(t * 64), 64), otypes=[object])(beta)
    return to_fractions(q), to_fractions(k), to_fractions(v), alpha_fr, beta_fr, to_fractions(S0)


def chi_square_pvalue(observed: np.ndarray, expected_probs: np.ndarray) -> float:
    """Pearson chi-square goodness of fit of counts ``observed`` to ``expected_probs``; cells of expectation below 5
    are pooled into one. The p-value is the regularised upper incomplete gamma Q(dof / 2, stat / 2)."""
    import torch

    n = observed.sum()
    expected = expected_probs * n
    big = expected >= 5
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), torch.tensor(stat / 2.0)))
