r"""Lower bounds for PCR-S: what any fixed-state model must tell apart, what a p-bit state can, and what write
strength a sign flip needs.

**Precision model (cache precision).** A model reads its input left to right; after a prefix everything it carries
forward is its *cache*. A pure-GDN model's cache is a fixed number ``s`` of numbers (per layer the conv state and the
recurrent state); at cache precision p every one of them is stored at p bits (fixed point ``fx<p>.<f>``, or a float
format of p bits) after every token. The arithmetic within a token is unrestricted (float64 in our runs, or exact).
This is weaker than "every operation at p bits", so a lower bound in it holds a fortiori there.

**Theorem (pure GDN, every size).** Let a model's cache take at most ``2^B`` values (``B = s p`` bits). For
``m >= m* = floor(B / log2 R) + 1`` and keys of ``L >= ceil(log2 m)`` letters (any ``n >= 1``), the model answers some
PCR-S input wrongly. *Proof.* Fix the bits and m distinct keys; the ``R^m > 2^B`` value assignments are the prefixes
of a fooling set (:func:`prove_fooling_lemma`: two assignments that differ under key j get different answers for the
suffix that asks for j under either parity). Two of them share a cache (pigeonhole: :func:`prove_pigeonhole`); the
model continues identically from identical caches on the same suffix, so it gives one answer where two are right.

The checks: :func:`prove_fooling_lemma` (Z3, for every m and every pair of assignments, and the converse used for
the class count), :func:`check_fooling_set` (exhaustive, through the task's own parser), :func:`check_prefix_classes`
(the exact number of prefix classes, :func:`prefix_class_count`, brute force for small sizes), :func:`prove_pigeonhole`
(Z3, every ``B`` and ``R``), :func:`log_precision_threshold` (at ``p = c log2 T`` bits the bound still bites).

**Write strength.** :func:`prove_transition_spectrum` (Z3, every head size K): the GDN transition
``A = alpha (I - beta k k^T)`` with ``|k| = 1`` satisfies ``0 <= x^T A x <= |x|^2`` for all x iff ``beta <= 1``
(given ``alpha in (0, 1]``): with Qwen3-Next's ``beta = sigmoid(b)`` no step turns the state against itself, and
the construction's parity mechanism (a sign flip, ``x^T A x < 0`` for ``x = k``) needs ``beta > 1``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from .proof import ProofReport, _timed, _z3_unsat
from .string_task import StringInstance, answer, key_string

__all__ = [
    "distinguishing_queries",
    "prove_fooling_lemma",
    "check_fooling_set",
    "prefix_class_count",
    "count_prefix_classes",
    "check_prefix_classes",
    "pigeonhole_threshold",
    "prove_pigeonhole",
    "log_precision_threshold",
    "prove_transition_spectrum",
]


def distinguishing_queries(keys: Sequence[str], differing: int, parity: int) -> tuple[str, str]:
    """The query pair that asks for ``keys[differing]`` under ``parity``: ``q_parity = keys[differing]``, the other
    query the first other key. Used by the adversary and checked by :func:`check_fooling_set`."""
    if len(keys) < 2 or not 0 <= differing < len(keys):
        raise ValueError(f"differing = {differing} must index one of at least 2 keys")
    target = keys[differing]
    other = keys[1] if differing == 0 else keys[0]
    return (target, other) if parity == 0 else (other, target)


@_timed
def prove_fooling_lemma() -> ProofReport:
    """Z3, every ``m >= 2``: keys are the indices ``0..m-1`` of distinct key strings, assignments ``f, g`` are
    uninterpreted functions, the answer of ``(p, f)`` to queries ``(q_0, q_1)`` is ``f(q_p)``.

    (a) if ``f(j) != g(j)`` for some j, then for either parity p some valid query pair (``q_0 != q_1``, both keys)
        gets different answers (the model must tell ``f`` and ``g`` apart);
    (b) for ``m >= 3``: ``(0, f)`` and ``(1, g)`` answer alike on every valid pair iff ``f`` and ``g`` are one and
        the same constant; for ``m = 2`` iff ``g`` is ``f`` with its two keys swapped. So each key set carries
        ``2 R^m - R`` prefix classes for ``m >= 3`` and ``R^2`` for ``m = 2`` (:func:`prefix_class_count`).
    """
    import z3

    m, j, p, q0, q1, i, k = z3.Ints("m j p q0 q1 i k")
    f = z3.Function("f", z3.IntSort(), z3.IntSort())
    g = z3.Function("g", z3.IntSort(), z3.IntSort())

    def valid(a, b):
        return z3.And(a != b, a >= 0, a < m, b >= 0, b < m)

    def asked(par, a, b):
        return z3.If(par == 0, a, b)

    # (a): the negation says every valid pair answers alike; it contradicts f(j) != g(j)
    same_everywhere = z3.ForAll([q0, q1], z3.Implies(valid(q0, q1), f(asked(p, q0, q1)) == g(asked(p, q0, q1))))
    status_a, witness_a = _z3_unsat([m >= 2, j >= 0, j < m, z3.Or(p == 0, p == 1), f(j) != g(j)], same_everywhere)
    # (b): (0, f) ~ (1, g) means f(q_0) = g(q_1) on every valid pair
    alike = z3.ForAll([q0, q1], z3.Implies(valid(q0, q1), f(q0) == g(q1)))
    in_range = z3.And(i >= 0, i < m, k >= 0, k < m)
    one_constant = z3.ForAll([i, k], z3.Implies(in_range, z3.And(f(i) == f(k), f(i) == g(k))))
    status_b1, witness_b1 = _z3_unsat([m >= 3, alike], z3.Not(one_constant))
    status_b2, witness_b2 = _z3_unsat([m >= 3, one_constant], z3.Not(alike))
    swapped = z3.And(g(0) == f(1), g(1) == f(0))
    status_b3, witness_b3 = _z3_unsat([m == 2], z3.Not(alike == swapped))
    statuses = {"assignments_that_differ_are_told_apart": status_a,
                "m>=3: parities alike iff one constant (=>)": status_b1,
                "m>=3: parities alike iff one constant (<=)": status_b2,
                "m=2: parities alike iff keys swapped": status_b3}
    final = "proved" if set(statuses.values()) == {"proved"} else (
        "refuted" if "refuted" in statuses.values() else "unknown")
    details: dict[str, Any] = {"parts": statuses}
    if final != "proved":
        details["witness"] = str(next(w for w in (witness_a, witness_b1, witness_b2, witness_b3)
                                      if w is not None))[:400]
    return ProofReport("fooling_lemma", final, "every m >= 2, every R, every pair of value assignments (Z3)", details)


@_timed
def check_fooling_set(n: int = 3, m: int = 4, key_length: int = 2, num_values: int = 2,
                      keys: Sequence[str] | None = None) -> ProofReport:
    """Exhaustive: on fixed bits (all ones) and keys, every pair of the ``R^m`` value assignments is told apart by
    :func:`distinguishing_queries` under the task's own parser (:func:`~lumotree.expressivity.string_task.answer`
    of the rendered tokens), for both parities."""
    keys = list(keys) if keys is not None else [key_string(i, key_length) for i in range(m)]
    assignments = list(itertools.product(range(num_values), repeat=len(keys)))
    pairs = 0
    for parity in (0, 1):
        bits = (1,) * (n - 1) + (parity,) if n > 1 else (parity,)
        bits = bits if sum(bits) % 2 == parity else (0,) * (n - 1) + (parity,)
        for a, b in itertools.combinations(assignments, 2):
            j = next(x for x in range(len(keys)) if a[x] != b[x])
            queries = distinguishing_queries(keys, j, parity)
            first = StringInstance(bits, tuple(keys), a, queries, num_values)
            second = StringInstance(bits, tuple(keys), b, queries, num_values)
            if answer(first.tokens, num_values) == answer(second.tokens, num_values):
                return ProofReport("fooling_set_exhaustive", "refuted", "", {"first": first.render(),
                                                                            "second": second.render()})
            pairs += 1
    return ProofReport("fooling_set_exhaustive", "proved",
                       f"all {len(assignments)} value assignments on m = {len(keys)} keys of length "
                       f"{len(keys[0])}, R = {num_values}, both parities: {pairs} pairs told apart",
                       {"assignments": len(assignments), "pairs": pairs})


def prefix_class_count(m: int, key_length: int, num_values: int) -> int:
    """The number of prefixes ``BOS bits SEP pairs`` that some suffix tells apart: ``C(2^L, m) (2 R^m - R)`` for
    ``m >= 3`` (key sets times assignments, doubled by the parity except for constant assignments) and
    ``C(2^L, 2) R^2`` for ``m = 2`` (the parity only swaps the two query slots), by :func:`prove_fooling_lemma`."""
    per_key_set = num_values**2 if m == 2 else 2 * num_values**m - num_values
    return math.comb(1 << key_length, m) * per_key_set


def count_prefix_classes(n: int, m: int, key_length: int, num_values: int) -> int:
    """Brute force: every prefix (all bit strings, ordered distinct keys, values), its answer on every query pair
    over all ``2^L`` strings (invalid pairs answer None), computed by the task's parser; the number of distinct
    answer tables."""
    strings = [key_string(i, key_length) for i in range(1 << key_length)]
    suffixes = [(a, b) for a in strings for b in strings if a != b]
    tables = set()
    for bits in itertools.product((0, 1), repeat=n):
        for keys in itertools.permutations(strings, m):
            for values in itertools.product(range(num_values), repeat=m):
                row = []
                for q in suffixes:
                    if q[0] in keys and q[1] in keys:
                        row.append(answer(StringInstance(bits, keys, values, q, num_values).tokens, num_values))
                    else:
                        row.append(None)
                tables.add(tuple(row))
    return len(tables)


@_timed
def check_prefix_classes(sizes: Sequence[tuple[int, int, int, int]] = (
        (1, 2, 1, 2), (2, 2, 2, 2), (1, 3, 2, 2), (1, 2, 2, 3), (1, 4, 2, 2), (1, 3, 2, 3))) -> ProofReport:
    """Exhaustive: the brute-force class count equals :func:`prefix_class_count` for each ``(n, m, L, R)``."""
    rows = []
    for n, m, L, R in sizes:
        brute, formula = count_prefix_classes(n, m, L, R), prefix_class_count(m, L, R)
        rows.append({"n": n, "m": m, "L": L, "R": R, "brute_force": brute, "formula": formula})
        if brute != formula:
            return ProofReport("prefix_classes_exhaustive", "refuted", "", {"rows": rows})
    return ProofReport("prefix_classes_exhaustive", "proved",
                       f"brute force = prefix_class_count for (n, m, L, R) in {[tuple(s) for s in sizes]}",
                       {"rows": rows})


def pigeonhole_threshold(state_bits: int, num_values: int) -> dict[str, Any]:
    """``m* = floor(B / log2 R) + 1`` (then ``R^m* > 2^B``) and the key length it needs, ``ceil(log2 m*)``."""
    if isinstance(state_bits, bool) or not isinstance(state_bits, int) or state_bits < 1:
        raise ValueError(f"state_bits = {state_bits!r} must be a positive integer")
    if isinstance(num_values, bool) or not isinstance(num_values, int) or num_values < 2:
        raise ValueError(f"num_values = {num_values!r} must be an integer >= 2")
    pairs = math.floor(state_bits / math.log2(num_values)) + 1
    if state_bits <= 1 << 14:  # exact integer check of the float floor: the smallest m with R^m > 2^B
        while pairs > 1 and num_values ** (pairs - 1) > 2**state_bits:
            pairs -= 1
        while num_values**pairs <= 2**state_bits:
            pairs += 1
    return {"state_bits": state_bits, "num_values": num_values, "pairs": pairs,
            "key_length": max(1, math.ceil(math.log2(pairs)))}


@_timed
def prove_pigeonhole() -> ProofReport:
    """Z3, every ``B >= 1`` and ``R >= 2`` (as ``l = log2 R > 0``): ``m* = floor(B / l) + 1`` has ``m* l > B``, so
    ``R^m* > 2^B`` assignments meet at most ``2^B`` caches."""
    import z3

    B, l, y = z3.Reals("B l y")
    k = z3.Int("k")
    # k = floor(B / l): k <= B / l < k + 1
    constraints = [B >= 1, l > 0, y * l == B, z3.ToReal(k) <= y, y < z3.ToReal(k) + 1]
    status, witness = _z3_unsat(constraints, z3.Not((z3.ToReal(k) + 1) * l > B))
    details = {} if witness is None else {"witness": str(witness)}
    return ProofReport("pigeonhole", status, "every state size B and every R >= 2 (Z3)", details)


def log_precision_threshold(cache_numbers: int, c: float, num_values: int = 2, n: int = 1,
                            m_max: int = 1 << 40) -> dict[str, Any]:
    """At ``p = c log2 T`` bits per number (log precision; ``T`` the input length with ``L = ceil(log2 m)``), the
    smallest m with ``m log2 R > s p``, after which the bound holds for every larger m checked (powers of two up to
    ``m_max``; ``m / log2 T(m)`` grows, so it holds beyond)."""
    if cache_numbers < 1 or c <= 0:
        raise ValueError("cache_numbers must be >= 1 and c > 0")

    def length(m: int) -> int:
        L = max(1, math.ceil(math.log2(m)))
        return n + 2 + m * (L + 1) + 2 * L + 2

    def fails(m: int) -> bool:
        return m * math.log2(num_values) > cache_numbers * c * math.log2(length(m))

    lo, hi = 2, 2
    while not fails(hi):
        if hi > m_max:
            return {"found": False, "m_max": m_max}
        lo, hi = hi, hi * 2
    while lo < hi:
        mid = (lo + hi) // 2
        if fails(mid):
            hi = mid
        else:
            lo = mid + 1
    checked = [hi * 2**e for e in range(0, 40) if hi * 2**e <= m_max]
    return {"found": True, "pairs": hi, "key_length": max(1, math.ceil(math.log2(hi))), "length": length(hi),
            "bits_per_number": c * math.log2(length(hi)), "holds_beyond": all(fails(x) for x in checked),
            "checked_up_to": checked[-1]}


@_timed
def prove_transition_spectrum(beta_max: float = 1.0) -> ProofReport:
    """Z3, every head size K: with ``a = |x|^2``, ``d = (k . x)^2`` (``0 <= d <= a`` for a unit k, Cauchy-Schwarz),
    the Rayleigh numerator of ``A = alpha (I - beta k k^T)`` is ``alpha (a - beta d)``.

    (a) ``beta in [0, beta_max]`` (default 1), ``alpha in [0, 1]``: ``0 <= alpha (a - beta d) <= a`` (spectrum in
        [0, 1]: no step turns a state against itself; refuted for any ``beta_max > 1``);
    (b) ``beta in (1, 2]``, ``alpha in (0, 1]``, ``x = k`` (``d = a > 0``): ``alpha (a - beta d) < 0`` (the
        reflection along k that the parity head uses).
    """
    import z3

    a, d, alpha, beta = z3.Reals("a d alpha beta")
    quotient = alpha * (a - beta * d)
    base = [a >= 0, d >= 0, d <= a, alpha >= 0, alpha <= 1]
    bound = z3.Q(*Fraction(beta_max).limit_denominator(10**9).as_integer_ratio())
    status_a, witness_a = _z3_unsat(base + [beta >= 0, beta <= bound], z3.Not(z3.And(quotient >= 0, quotient <= a)))
    status_b, witness_b = _z3_unsat([a > 0, d == a, alpha > 0, alpha <= 1, beta > 1, beta <= 2],
                                    z3.Not(quotient < 0))
    parts = {f"beta_in_[0,{beta_max}]_spectrum_in_[0,1]": status_a, "beta_in_(1,2]_negative_along_k": status_b}
    final = "proved" if set(parts.values()) == {"proved"} else "refuted"
    details: dict[str, Any] = {"parts": parts}
    if final != "proved":
        details["witness"] = str(witness_a or witness_b)[:400]
    return ProofReport("transition_spectrum", final, "every head size K, every unit key k (Z3)", details)
