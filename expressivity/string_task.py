r"""Parity-conditioned retrieval with string keys (PCR-S): a fixed vocabulary, unboundedly many keys.

The single-token task of :mod:`~lumotree.expressivity.task` draws keys from a vocabulary of ``M`` tokens, so a model
whose width grows with ``M`` can hold one slot per key (a pure Gated DeltaNet can then solve it exactly). Here every
key is a **string of L letters over the fixed alphabet {a, b}**: ``2^L`` keys at a fixed vocabulary of ``8 + R``
tokens, so a model of fixed width faces as many keys as the input length allows.

Vocabulary (token ids; ``R`` values)::

    BOS = 0, "0" = 1, "1" = 2, SEP = 3, "?" = 4, "a" = 5, "b" = 6, "," = 7, V_r = 8 + r (r < R)

An input with ``n >= 1`` bits, ``m >= 2`` pairs and key length ``L >= 1`` (``m <= 2^L``) is::

    BOS b_1 .. b_n SEP k_1 v_1 .. k_m v_m ? q_0 , q_1

where each ``k_j`` and each query is L letters, the keys are pairwise distinct, the values any (repeats allowed), and
``q_0 != q_1`` both occur among the keys. The answer is the value stored under ``q_p``, ``p = b_1 xor .. xor b_n``:
the token a model must emit after the last letter of ``q_1``. Length: ``n + 2 + m (L + 1) + 2 L + 2`` tokens. With
``L = 1`` the keys are the two letters: the task then is the single-token task with ``M = 2`` plus the comma.

The comma ends the first query (keys are not self-delimiting when a model does not know L). A predictor that
ignores the bits is right with probability at most ``1/2 + 1/(2R)`` (:func:`~lumotree.expressivity.task.
parity_blind_accuracy`), exactly as for the single-token task.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
import numpy as np

from .task import BOS, ONE, QUERY, SEP, ZERO, Score, _check_int, _rng, parity_blind_accuracy

__all__ = [
    "LETTER_A",
    "LETTER_B",
    "COMMA",
    "NUM_FIXED",
    "LETTERS",
    "StringVocabulary",
    "StringTaskSpec",
    "StringInstance",
    "key_string",
    "key_number",
    "generate",
    "parse",
    "answer",
    "score",
]

LETTER_A, LETTER_B, COMMA = 5, 6, 7
NUM_FIXED = 8  # token ids below the values
LETTERS = "ab"
_FIXED_NAMES = ("<bos>", "0", "1", "<sep>", "?", "a", "b", ",")


@dataclass(frozen=True)
class StringVocabulary:
    """The fixed vocabulary plus ``num_values`` value tokens (layout in the module docstring)."""

    num_values: int

    def __post_init__(self) -> None:
        _check_int("num_values", self.num_values, 1)

    @property
    def size(self) -> int:
        """``8 + R``."""
        return NUM_FIXED + self.num_values

    def value(self, r: int) -> int:
        if not 0 <= r < self.num_values:
            raise ValueError(f"value index {r} is outside [0, {self.num_values})")
        return NUM_FIXED + int(r)

    def is_value(self, token: int) -> bool:
        return NUM_FIXED <= token < self.size

    def value_index(self, token: int) -> int:
        if not self.is_value(token):
            raise ValueError(f"token {token} ({self.name(token)}) is not a value")
        return int(token) - NUM_FIXED

    @staticmethod
    def is_letter(token: int) -> bool:
        return token in (LETTER_A, LETTER_B)

    @staticmethod
    def letters(key: str) -> list[int]:
        """Token ids of a key string."""
        return [LETTER_A if c == "a" else LETTER_B for c in key]

    def name(self, token: int) -> str:
        token = int(token)
        if 0 <= token < NUM_FIXED:
            return _FIXED_NAMES[token]
        if self.is_value(token):
            return f"V{token - NUM_FIXED}"
        return f"<unk:{token}>"

    def render(self, tokens: Iterable[int]) -> str:
        """Readable text; the letters of one key are written together (``abba``)."""
        out: list[str] = []
        glue = False
        for t in tokens:
            name = self.name(t)
            if self.is_letter(int(t)) and glue:
                out[-1] += name
            else:
                out.append(name)
            glue = self.is_letter(int(t))
        return " ".join(out)


def key_string(number: int, key_length: int) -> str:
    """The key with binary digits ``number`` (most significant first), ``a = 0``, ``b = 1``."""
    _check_int("key_length", key_length, 1)
    if not 0 <= number < (1 << key_length):
        raise ValueError(f"key number {number} is outside [0, 2^{key_length})")
    return "".join(LETTERS[(number >> (key_length - 1 - i)) & 1] for i in range(key_length))


def key_number(key: str) -> int:
    """Inverse of :func:`key_string`."""
    if not key or any(c not in LETTERS for c in key):
        raise ValueError(f"key {key!r} must be a non-empty string over {{a, b}}")
    return int(key.replace("a", "0").replace("b", "1"), 2)


@dataclass(frozen=True)
class StringTaskSpec:
    """``n`` bits, ``m`` pairs, keys of ``key_length`` L letters, ``num_values`` R (``n >= 1``, ``2 <= m <= 2^L``,
    ``R >= 1``)."""

    n: int
    m: int
    key_length: int
    num_values: int

    def __post_init__(self) -> None:
        _check_int("n", self.n, 1)
        _check_int("m", self.m, 2)
        _check_int("key_length", self.key_length, 1)
        _check_int("num_values", self.num_values, 1)
        if self.m > (1 << self.key_length):
            raise ValueError(f"m = {self.m} pairs need m distinct keys but there are only 2^{self.key_length} = "
                             f"{1 << self.key_length} keys of length key_length = {self.key_length}")

    @property
    def vocab(self) -> StringVocabulary:
        return StringVocabulary(self.num_values)

    @property
    def length(self) -> int:
        """``n + 2 + m (L + 1) + 2 L + 2``."""
        return self.n + 2 + self.m * (self.key_length + 1) + 2 * self.key_length + 2


@dataclass(frozen=True)
class StringInstance:
    """One input: ``bits``, ``keys`` (strings over {a, b}, one length L), ``values`` (indices), ``queries = (q_0,
    q_1)`` (key strings). Validated on construction; ``tokens`` and ``answer`` are token ids."""

    bits: tuple[int, ...]
    keys: tuple[str, ...]
    values: tuple[int, ...]
    queries: tuple[str, str]
    num_values: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "bits", tuple(int(b) for b in self.bits))
        object.__setattr__(self, "keys", tuple(str(k) for k in self.keys))
        object.__setattr__(self, "values", tuple(int(v) for v in self.values))
        object.__setattr__(self, "queries", tuple(str(q) for q in self.queries))
        StringVocabulary(self.num_values)
        if len(self.bits) < 1:
            raise ValueError("bits: n = 0; the task needs n >= 1 bits")
        if any(b not in (0, 1) for b in self.bits):
            raise ValueError(f"bits must be 0 or 1, got {self.bits}")
        if len(self.keys) != len(self.values):
            raise ValueError(f"{len(self.keys)} keys but {len(self.values)} values: pairs need one of each")
        if len(self.keys) < 2:
            raise ValueError(f"m = {len(self.keys)} pairs; the task needs m >= 2 (two distinct query keys)")
        for key in self.keys:
            if not key or any(c not in LETTERS for c in key):
                raise ValueError(f"key {key!r} must be a non-empty string over {{a, b}}")
        lengths = {len(k) for k in self.keys}
        if len(lengths) != 1:
            raise ValueError(f"keys {self.keys} have different lengths {sorted(lengths)}; one key length per input")
        if len(set(self.keys)) != len(self.keys):
            raise ValueError(f"keys {self.keys} are not distinct")
        bad = [v for v in self.values if not 0 <= v < self.num_values]
        if bad:
            raise ValueError(f"values {bad} are outside [0, {self.num_values})")
        if len(self.queries) != 2:
            raise ValueError(f"queries must be a pair (q_0, q_1), got {self.queries}")
        q0, q1 = self.queries
        if q0 == q1:
            raise ValueError(f"queries q_0 = q_1 = {q0!r}; they must be distinct")
        for name, q in (("q_0", q0), ("q_1", q1)):
            if q not in self.keys:
                raise ValueError(f"query {name} = {q!r} is not among the keys {list(self.keys)}")

    @property
    def key_length(self) -> int:
        return len(self.keys[0])

    @property
    def spec(self) -> StringTaskSpec:
        return StringTaskSpec(len(self.bits), len(self.keys), self.key_length, self.num_values)

    @property
    def vocab(self) -> StringVocabulary:
        return StringVocabulary(self.num_values)

    @property
    def parity(self) -> int:
        return sum(self.bits) % 2

    @property
    def answer_index(self) -> int:
        return self.values[self.keys.index(self.queries[self.parity])]

    @property
    def answer(self) -> int:
        return self.vocab.value(self.answer_index)

    @property
    def tokens(self) -> np.ndarray:
        """``[n + 2 + m (L + 1) + 2L + 2]`` int64 token ids."""
        vocab = self.vocab
        out = [BOS, *(ONE if b else ZERO for b in self.bits), SEP]
        for k, v in zip(self.keys, self.values):
            out += [*vocab.letters(k), vocab.value(v)]
        out += [QUERY, *vocab.letters(self.queries[0]), COMMA, *vocab.letters(self.queries[1])]
        return np.asarray(out, dtype=np.int64)

    @property
    def prefix_length(self) -> int:
        """Tokens up to and including the last value (everything before ``?``)."""
        return len(self.bits) + 2 + len(self.keys) * (self.key_length + 1)

    def render(self) -> str:
        return self.vocab.render(self.tokens)


def parse(tokens: Sequence[int], num_values: int) -> StringInstance:
    """Read a token sequence back into a :class:`StringInstance`; malformed input raises ``ValueError`` saying what
    is wrong and where."""
    vocab = StringVocabulary(num_values)
    toks = [int(t) for t in np.asarray(tokens).reshape(-1)]
    bad = [(i, t) for i, t in enumerate(toks) if not 0 <= t < vocab.size]
    if bad:
        raise ValueError(f"tokens: id {bad[0][1]} at position {bad[0][0]} is outside the vocabulary [0, {vocab.size})")
    if not toks or toks[0] != BOS:
        raise ValueError("tokens: an input starts with BOS")
    if SEP not in toks:
        raise ValueError("tokens: no SEP after the bits")
    sep = toks.index(SEP)
    if any(t not in (ZERO, ONE) for t in toks[1:sep]):
        where = next(i for i in range(1, sep) if toks[i] not in (ZERO, ONE))
        raise ValueError(f"tokens: position {where} ({vocab.name(toks[where])}) is not a bit; bits run up to SEP")
    if QUERY not in toks[sep + 1 :]:
        raise ValueError("tokens: no '?' after the key-value pairs")
    qm = toks.index(QUERY, sep + 1)
    pairs, suffix = toks[sep + 1 : qm], toks[qm + 1 :]
    keys, values, current = [], [], ""
    for offset, t in enumerate(pairs):
        pos = sep + 1 + offset
        if vocab.is_letter(t):
            current += LETTERS[t - LETTER_A]
        elif vocab.is_value(t):
            if not current:
                raise ValueError(f"tokens: value at position {pos} ({vocab.name(t)}) has no key before it")
            keys.append(current)
            values.append(vocab.value_index(t))
            current = ""
        else:
            raise ValueError(f"tokens: position {pos} ({vocab.name(t)}) is neither a key letter nor a value")
    if current:
        raise ValueError(f"tokens: key {current!r} before '?' has no value")
    if suffix.count(COMMA) != 1:
        raise ValueError("tokens: an input ends with '? q_0 , q_1' (exactly one comma)")
    comma = suffix.index(COMMA)
    queries = []
    for part, start in ((suffix[:comma], qm + 1), (suffix[comma + 1 :], qm + 2 + comma)):
        for offset, t in enumerate(part):
            if not vocab.is_letter(t):
                raise ValueError(f"tokens: query position {start + offset} ({vocab.name(t)}) is not a key letter")
        queries.append("".join(LETTERS[t - LETTER_A] for t in part))
    for name, q in zip(("q_0", "q_1"), queries):
        if not q:
            raise ValueError(f"tokens: query {name} is empty")
    return StringInstance(tuple(1 if t == ONE else 0 for t in toks[1:sep]), tuple(keys), tuple(values),
                          (queries[0], queries[1]), num_values)


def answer(tokens: Sequence[int], num_values: int) -> int:
    """The exact answer (a value token id) of an input token sequence; malformed input raises ``ValueError``."""
    return parse(tokens, num_values).answer


def _distinct_keys(rng: np.random.Generator, m: int, key_length: int) -> list[str]:
    if key_length <= 62:
        if (1 << key_length) <= 4 * m:
            numbers = rng.choice(1 << key_length, size=m, replace=False).tolist()
        else:
            chosen: dict[int, None] = {}
            while len(chosen) < m:
                chosen.setdefault(int(rng.integers(0, 1 << key_length)), None)
            numbers = list(chosen)
        return [key_string(int(x), key_length) for x in numbers]
    found: dict[str, None] = {}
    while len(found) < m:
        found.setdefault("".join(LETTERS[b] for b in rng.integers(0, 2, key_length)), None)
    return list(found)


def generate(spec: StringTaskSpec, count: int, seed: int | np.random.Generator = 0) -> list[StringInstance]:
    """``count`` instances drawn uniformly (bits, distinct keys, values, an ordered distinct query pair) from a seeded
    generator; the same seed gives the same instances."""
    if not isinstance(spec, StringTaskSpec):
        raise TypeError(f"spec must be a StringTaskSpec, got {type(spec).__name__}")
    count = _check_int("count", count, 0)
    rng = _rng(seed)
    out = []
    for _ in range(count):
        bits = rng.integers(0, 2, spec.n)
        keys = _distinct_keys(rng, spec.m, spec.key_length)
        values = rng.integers(0, spec.num_values, spec.m)
        slots = rng.choice(spec.m, size=2, replace=False)
        out.append(StringInstance(tuple(bits), tuple(keys), tuple(values), (keys[slots[0]], keys[slots[1]]),
                                  spec.num_values))
    return out


def score(predictions: Sequence[int], instances: Sequence[StringInstance]) -> Score:
    """Exact-match accuracy of predicted answer token ids (chance: the parity-blind level)."""
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

