"""Random coins for tree verification, passed in so that the same code runs sampled or enumerated.

:class:`Coins` is the protocol (``bernoulli(p) -> bool``, ``categorical(probs) -> int``); :class:`RandomCoins` draws
them from a seeded numpy generator; :func:`enumerate_outcomes` runs a function under every coin outcome and returns the
exact distribution of its results (the weights multiply exactly for ``Fraction`` and sympy numbers).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["Coins", "RandomCoins", "enumerate_outcomes", "is_float", "is_nan", "FLOAT_SUM_TOLERANCE"]

Prob = Any  # float, Fraction, sympy number: anything with +, -, *, / and decidable comparisons
Distribution = Sequence[Prob]
FLOAT_SUM_TOLERANCE = 1e-9  # float probabilities sum to 1 within this


def is_float(x: Any) -> bool:
    return isinstance(x, (float, np.floating))


def is_nan(x: Any) -> bool:
    """True for a float NaN (exact numbers are never NaN; ``x != x`` would not be decidable for every type)."""
    return is_float(x) and math.isnan(x)


@runtime_checkable
class Coins(Protocol):
    """The source of randomness of verification and drafting.

    ``bernoulli(p)`` returns True with probability ``p``; ``categorical(probs)`` returns index i with probability
    ``probs[i]`` (``probs`` sums to 1). Implementations: :class:`RandomCoins`, and the replaying coins inside
    :func:`enumerate_outcomes`.
    """

    def bernoulli(self, p: Prob) -> bool: ...

    def categorical(self, probs: Distribution) -> int: ...


class RandomCoins:
    """Coins from a seeded ``numpy.random.Generator`` (exact probabilities are converted to float to draw).

    A coin with ``p <= 0`` or ``p >= 1`` and an index with probability 0 are never drawn, whatever the generator says.
    """

    def __init__(self, seed: int | np.random.Generator = 0):
        self.rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)

    def bernoulli(self, p: Prob) -> bool:
        if is_nan(p):
            raise ValueError(f"bernoulli(p): p = {p} is not a number")
        if p <= 0:
            return False
        if p >= 1:
            return True
        return bool(self.rng.random() < float(p))

    def categorical(self, probs: Distribution) -> int:
        weights = np.array([float(x) for x in probs], dtype=np.float64)  # [vocab]
        if np.isnan(weights).any():
            raise ValueError(f"categorical(probs): probs[{int(np.flatnonzero(np.isnan(weights))[0])}] is NaN")
        if weights.ndim != 1 or weights.size == 0 or not np.all(weights >= 0) or weights.sum() <= 0:
            raise ValueError(f"probs must be a non-empty non-negative vector with positive mass, got {list(probs)}")
        if not np.isfinite(weights.sum()):
            raise ValueError(f"categorical(probs): probs has infinite mass, got {list(probs)}")
        cumulative = np.cumsum(weights)  # [vocab]
        # first index whose cumulative mass exceeds u: an index of zero weight is never the first
        index = int(np.searchsorted(cumulative, self.rng.random() * cumulative[-1], side="right"))
        if index >= weights.size:  # u rounded up onto the total mass
            index = int(np.flatnonzero(weights > 0)[-1])
        return index


class _ReplayCoins:
    """Coins that follow a recorded prefix of branch choices, then take the first option at every new branch point.

    Every call is a branch point with its options of positive probability; the product of the chosen options'
    probabilities is the weight of the run.
    """

    def __init__(self, prefix: list[int]):
        self.prefix = prefix
        self.choices: list[int] = []
        self.counts: list[int] = []
        self.weight: Prob = 1

    def _choose(self, options: list[tuple[Any, Prob]]) -> Any:
        k = len(self.choices)
        choice = self.prefix[k] if k < len(self.prefix) else 0
        if choice >= len(options):
            raise RuntimeError(
                "the enumerated function is not deterministic given its coins: a replayed branch point has fewer "
                "options than when it was first seen"
            )
        self.choices.append(choice)
        self.counts.append(len(options))
        value, prob = options[choice]
        self.weight = self.weight * prob
        return value

    def bernoulli(self, p: Prob) -> bool:
        if is_nan(p) or p < 0 or p > 1:
            raise ValueError(f"bernoulli(p) needs 0 <= p <= 1, got p = {p}")
        options = [(v, q) for v, q in ((True, p), (False, 1 - p)) if q != 0]
        return self._choose(options)

    def categorical(self, probs: Distribution) -> int:
        options = []
        for i, q in enumerate(probs):
            if is_nan(q) or q < 0:
                raise ValueError(f"categorical(probs): probs[{i}] = {q} is negative or not a number")
            if q != 0:
                options.append((i, q))
        if not options:
            raise ValueError("categorical(probs): probs has no positive entry")
        return self._choose(options)


def enumerate_outcomes(fn: Callable[[Coins], Hashable]) -> dict[Hashable, Prob]:
    """The exact distribution of ``fn(coins)`` over every outcome of its coins: ``{outcome: probability}``.

    Depth-first over the tree of branch points by replay: each run follows a recorded prefix of choices and extends it
    with first options; the next run advances the deepest branch point that has options left. Zero-probability
    branches are never explored, outcomes that coincide are summed. ``fn`` must be deterministic given its coins and
    return a hashable outcome. Cost: one run of ``fn`` per distinct coin path.

    For exact probabilities the result sums to exactly 1 (checked: a ``categorical`` fed an unnormalised vector
    raises here), for floats to 1e-9.
    """
    distribution: dict[Hashable, Prob] = {}
    prefix: list[int] = []
    while True:
        coins = _ReplayCoins(prefix)
        outcome = fn(coins)
        try:
            hash(outcome)
        except TypeError as exc:
            raise TypeError(f"fn must return a hashable outcome, got {type(outcome).__name__}") from exc
        distribution[outcome] = distribution.get(outcome, 0) + coins.weight
        level = len(coins.choices) - 1
        while level >= 0 and coins.choices[level] + 1 >= coins.counts[level]:
            level -= 1
        if level < 0:
            break
        prefix = coins.choices[:level] + [coins.choices[level] + 1]
    total = sum(distribution.values())
    if is_float(total):
        ok = abs(total - 1) <= FLOAT_SUM_TOLERANCE
    else:
        ok = total == 1
    if not ok:
        raise RuntimeError(
            f"enumerated outcome probabilities sum to {total}, not 1: a coin was given an unnormalised distribution"
        )
    return distribution
