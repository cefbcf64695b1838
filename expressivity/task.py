r"""Parity-conditioned retrieval: the task, its vocabulary, a seeded generator, the exact answer and a scorer.

**Definition (lumotree's; the published statement gives only an abstract).** Parameters: ``n >= 1`` bits,
``m >= 2`` key-value pairs, a key vocabulary of ``M >= m`` keys and a value vocabulary of ``R >= 1`` values.
Vocabulary (token ids)::

    BOS = 0, "0" = 1, "1" = 2, SEP = 3, "?" = 4, K_i = 5 + i (i < M), V_r = 5 + M + r (r < R)

An input is::

    BOS b_1 .. b_n SEP k_1 v_1 .. k_m v_m ? q_0 q_1

with bits ``b_t in {0, 1}``, pairwise distinct keys ``k_j``, any values ``v_j`` (repeats allowed), and two distinct
query keys ``q_0 != q_1`` that both occur among the ``k_j``. The answer is the value stored under ``q_p`` with
``p = b_1 xor .. xor b_n``: the single next token a model must emit after ``q_1``.

The generator draws bits, keys (without replacement), values and the query pair uniformly with a seeded
``numpy.random.Generator``. A predictor that ignores the bits can do no better than answering with the value of one
fixed query slot, right with probability ``1/2 + 1/(2R)`` on uniform instances (both slots hold the same value with
probability ``1/R``): :func:`parity_blind_accuracy` is the chance level the constructions are compared with.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "BOS",
    "ZERO",
    "ONE",
    "SEP",
    "QUERY",
    "NUM_SPECIAL",
    "Vocabulary",
    "TaskSpec",
    "Instance",
    "generate",
    "answer",
    "parse",
    "score",
    "Score",
    "parity_blind_accuracy",
]

BOS, ZERO, ONE, SEP, QUERY = 0, 1, 2, 3, 4
NUM_SPECIAL = 5
_SPECIAL_NAMES = ("<bos>", "0", "1", "<sep>", "?")


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} = {value!r} must be an integer")
    if value < minimum:
        raise ValueError(f"{name} = {value} must be >= {minimum}")
    return int(value)


@dataclass(frozen=True)
class Vocabulary:
    """Token ids for ``num_keys`` keys and ``num_values`` values (see the module docstring for the layout)."""

    num_keys: int
    num_values: int

    def __post_init__(self) -> None:
        _check_int("num_keys", self.num_keys, 1)
        _check_int("num_values", self.num_values, 1)

    @property
    def size(self) -> int:
        """``5 + M + R``."""
        return NUM_SPECIAL + self.num_keys + self.num_values

    def key(self, i: int) -> int:
        """Token id of key ``K_i``."""
        if not 0 <= i < self.num_keys:
            raise ValueError(f"key index {i} is outside [0, {self.num_keys})")
        return NUM_SPECIAL + int(i)

    def value(self, r: int) -> int:
        """Token id of value ``V_r``."""
        if not 0 <= r < self.num_values:
            raise ValueError(f"value index {r} is outside [0, {self.num_values})")
        return NUM_SPECIAL + self.num_keys + int(r)

    def is_key(self, token: int) -> bool:
        return NUM_SPECIAL <= token < NUM_SPECIAL + self.num_keys

    def is_value(self, token: int) -> bool:
        return NUM_SPECIAL + self.num_keys <= token < self.size

    def key_index(self, token: int) -> int:
        if not self.is_key(token):
            raise ValueError(f"token {token} ({self.name(token)}) is not a key")
        return int(token) - NUM_SPECIAL

    def value_index(self, token: int) -> int:
        if not self.is_value(token):
            raise ValueError(f"token {token} ({self.name(token)}) is not a value")
        return int(token) - NUM_SPECIAL - self.num_keys

    def name(self, token: int) -> str:
        """Readable name: ``<bos>``, ``0``, ``1``, ``<sep>``, ``?``, ``K3``, ``V7`` (``<unk:id>`` outside)."""
        token = int(token)
        if 0 <= token < NUM_SPECIAL:
            return _SPECIAL_NAMES[token]
        if self.is_key(token):
            return f"K{token - NUM_SPECIAL}"
        if self.is_value(token):
            return f"V{token - NUM_SPECIAL - self.num_keys}"
        return f"<unk:{token}>"

    def render(self, tokens: Iterable[int]) -> str:
        return " ".join(self.name(t) for t in tokens)


@dataclass(frozen=True)
class TaskSpec:
    """Task parameters: ``n`` bits, ``m`` pairs, ``num_keys`` M, ``num_values`` R (validated: ``n >= 1``,
    ``2 <= m <= M``, ``R >= 1``)."""

    n: int
    m: int
    num_keys: int
    num_values: int

    def __post_init__(self) -> None:
        _check_int("n", self.n, 1)
        _check_int("m", self.m, 2)
        _check_int("num_keys", self.num_keys, 1)
        _check_int("num_values", self.num_values, 1)
        if self.m > self.num_keys:
            raise ValueError(
                f"m = {self.m} pairs need m distinct keys but the key vocabulary has only num_keys = {self.num_keys}"
            )

    @property
    def vocab(self) -> Vocabulary:
        return Vocabulary(self.num_keys, self.num_values)

    @property
    def length(self) -> int:
        """Input length ``n + 2m + 5`` (BOS, bits, SEP, pairs, ?, q_0, q_1)."""
        return self.n + 2 * self.m + 5


@dataclass(frozen=True)
class Instance:
    """One input: ``bits`` (0/1), ``keys`` and ``values`` (indices into the key / value vocabularies, one per pair),
    ``queries = (q_0, q_1)`` (key indices). Validated on construction; ``tokens`` and ``answer`` are token ids."""

    bits: tuple[int, ...]
    keys: tuple[int, ...]
    values: tuple[int, ...]
    queries: tuple[int, int]
    num_keys: int
    num_values: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "bits", tuple(int(b) for b in self.bits))
        object.__setattr__(self, "keys", tuple(int(k) for k in self.keys))
        object.__setattr__(self, "values", tuple(int(v) for v in self.values))
        object.__setattr__(self, "queries", tuple(int(q) for q in self.queries))
        Vocabulary(self.num_keys, self.num_values)  # validates the vocabulary sizes
        if len(self.bits) < 1:
            raise ValueError("bits: n = 0; the task needs n >= 1 bits")
        if any(b not in (0, 1) for b in self.bits):
            raise ValueError(f"bits must be 0 or 1, got {self.bits}")
        if len(self.keys) != len(self.values):
            raise ValueError(f"{len(self.keys)} keys but {len(self.values)} values: pairs need one of each")
        if len(self.keys) < 2:
            raise ValueError(f"m = {len(self.keys)} pairs; the task needs m >= 2 (two distinct query keys)")
        if len(self.keys) > self.num_keys:
            raise ValueError(
                f"m = {len(self.keys)} pairs need m distinct keys but the key vocabulary has only num_keys = "
                f"{self.num_keys}"
            )
        for name, items, size in (("keys", self.keys, self.num_keys), ("values", self.values, self.num_values)):
            bad = [x for x in items if not 0 <= x < size]
            if bad:
                raise ValueError(f"{name} {bad} are outside [0, {size})")
        if len(set(self.keys)) != len(self.keys):
            raise ValueError(f"keys {self.keys} are not distinct")
        if len(self.queries) != 2:
            raise ValueError(f"queries must be a pair (q_0, q_1), got {self.queries}")
        q0, q1 = self.queries
        if q0 == q1:
            raise ValueError(f"queries q_0 = q_1 = K{q0}; they must be distinct")
        for name, q in (("q_0", q0), ("q_1", q1)):
            if q not in self.keys:
                raise ValueError(f"query {name} = K{q} is not among the keys {['K%d' % k for k in self.keys]}")

    @property
    def spec(self) -> TaskSpec:
        return TaskSpec(len(self.bits), len(self.keys), self.num_keys, self.num_values)

    @property
    def vocab(self) -> Vocabulary:
        return Vocabulary(self.num_keys, self.num_values)

    @property
    def parity(self) -> int:
        """``b_1 xor .. xor b_n``."""
        return sum(self.bits) % 2

    @property
    def answer_index(self) -> int:
        """Index of the value stored under ``q_p``."""
        return self.values[self.keys.index(self.queries[self.parity])]

    @property
    def answer(self) -> int:
        """Token id of the answer."""
        return self.vocab.value(self.answer_index)

    @property
    def tokens(self) -> np.ndarray:
        """``[n + 2m + 5]`` int64 token ids."""
        vocab = self.vocab
        out = [BOS, *(ONE if b else ZERO for b in self.bits), SEP]
        for k, v in zip(self.keys, self.values):
            out += [vocab.key(k), vocab.value(v)]
        out += [QUERY, vocab.key(self.queries[0]), vocab.key(self.queries[1])]
        return np.asarray(out, dtype=np.int64)

    @property
    def prefix_length(self) -> int:
        """Tokens up to and including the last value (everything before ``? q_0 q_1``): ``n + 2m + 2``."""
        return len(self.bits) + 2 * len(self.keys) + 2

    def render(self) -> str:
        return self.vocab.render(self.tokens)


def parse(tokens: Sequence[int], num_keys: int, num_values: int) -> Instance:
    """Read an input token sequence back into an :class:`Instance`; malformed input raises ``ValueError`` saying
    what is wrong and where."""
    vocab = Vocabulary(num_keys, num_values)
    toks = [int(t) for t in np.asarray(tokens).reshape(-1)]
    bad = [(i, t) for i, t in enumerate(toks) if not 0 <= t < vocab.size]
    if bad:
        raise ValueError(f"tokens: id {bad[0][1]} at position {bad[0][0]} is outside the vocabulary [0, {vocab.size})")
    if len(toks) < 1 or toks[0] != BOS:
        raise ValueError("tokens: an input starts with BOS")
    if SEP not in toks:
        raise ValueError("tokens: no SEP after the bits")
    sep = toks.index(SEP)
    bit_tokens = toks[1:sep]
    if any(t not in (ZERO, ONE) for t in bit_tokens):
        where = next(i for i, t in enumerate(bit_tokens, start=1) if t not in (ZERO, ONE))
        raise ValueError(f"tokens: position {where} ({vocab.name(toks[where])}) is not a bit; bits run up to SEP")
    tail = toks[sep + 1 :]
    if len(tail) < 3 or tail[-3] != QUERY:
        raise ValueError("tokens: an input ends with '? q_0 q_1'")
    pairs = tail[:-3]
    if len(pairs) % 2:
        raise ValueError(f"tokens: {len(pairs)} tokens between SEP and '?'; expected key-value pairs")
    keys, values = [], []
    for j in range(0, len(pairs), 2):
        k, v = pairs[j], pairs[j + 1]
        if not vocab.is_key(k):
            raise ValueError(f"tokens: position {sep + 1 + j} ({vocab.name(k)}) should be a key")
        if not vocab.is_value(v):
            raise ValueError(f"tokens: position {sep + 2 + j} ({vocab.name(v)}) should be a value")
        keys.append(vocab.key_index(k))
        values.append(vocab.value_index(v))
    for pos, t in ((len(toks) - 2, tail[-2]), (len(toks) - 1, tail[-1])):
        if not vocab.is_key(t):
            raise ValueError(f"tokens: query at position {pos} ({vocab.name(t)}) is not a key")
    queries = (vocab.key_index(tail[-2]), vocab.key_index(tail[-1]))
    return Instance(tuple(1 if t == ONE else 0 for t in bit_tokens), tuple(keys), tuple(values), queries,
                    num_keys, num_values)


def answer(tokens: Sequence[int], num_keys: int, num_values: int) -> int:
    """The exact answer (a value token id) of an input token sequence; malformed input raises ``ValueError``."""
    return parse(tokens, num_keys, num_values).answer


def _rng(seed: int | np.random.Generator) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(_check_int("seed", seed, 0))


def generate(spec: TaskSpec, count: int, seed: int | np.random.Generator = 0) -> list[Instance]:
    """``count`` instances drawn uniformly (bits, distinct keys, values with repeats, an ordered distinct query pair)
    from a seeded generator; the same seed gives the same instances."""
    if not isinstance(spec, TaskSpec):
        raise TypeError(f"spec must be a TaskSpec, got {type(spec).__name__}")
    count = _check_int("count", count, 0)
    rng = _rng(seed)
    out = []
    for _ in range(count):
        bits = rng.integers(0, 2, spec.n)
        keys = rng.choice(spec.num_keys, size=spec.m, replace=False)
        values = rng.integers(0, spec.num_values, spec.m)
        slots = rng.choice(spec.m, size=2, replace=False)
        out.append(Instance(tuple(bits), tuple(keys), tuple(values), (keys[slots[0]], keys[slots[1]]),
                            spec.num_keys, spec.num_values))
    return out


def parity_blind_accuracy(num_values: int) -> float:
    """Chance level for predictors that ignore the bits: ``1/2 + 1/(2R)`` (always answer slot q_0's value)."""
    _check_int("num_values", num_values, 1)
    return 0.5 + 0.5 / num_values


@dataclass(frozen=True)
class Score:
    """``correct`` of ``total`` predictions; ``accuracy = correct / total``; ``chance`` the parity-blind level."""

    correct: int
    total: int
    chance: float

    @property
    def accuracy(self) -> float:
        return self.correct / self.total if self.total else float("nan")

    def as_dict(self) -> dict[str, Any]:
        return {"correct": self.correct, "total": self.total, "accuracy": self.accuracy, "chance": self.chance}


def score(predictions: Sequence[int], instances: Sequence[Instance]) -> Score:
    """Exact-match accuracy of predicted answer token ids against the instances' answers."""
    predictions = [int(p) for p in np.asarray(predictions).reshape(-1)]
    if len(predictions) != len(instances):
        raise ValueError(f"{len(predictions)} predictions for {len(instances)} instances")
    if not instances:
        raise ValueError("score needs at least one instance")
    R = {inst.num_values for inst in instances}
    if len(R) != 1:
        raise ValueError(f"instances mix value vocabularies {sorted(R)}")
    correct = sum(p == inst.answer for p, inst in zip(predictions, instances))
    return Score(correct, len(instances), parity_blind_accuracy(R.pop()))
