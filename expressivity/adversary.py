r"""Pure GDN, an executable lower bound: concrete counterexamples for a given pure-GDN model at a stated precision.

**Setting.** A pure-GDN reference model (every layer ``linear_attention``) whose cache is rounded to a stated
precision after every token: ``fp8`` (e4m3), ``bf16``, ``fp16`` or ``fp32``, saturating at the format's largest
finite value, or a p-bit fixed-point format ``"fx<p>.<f>"`` (:mod:`lumotree.reference.fixedpoint`). Its cache after a
prefix is everything the model carries forward: per layer the conv state ``[W - 1, C]`` and the recurrent state
``[HV, K, V]``. (:class:`RoundedRunner` also rounds the KV caches of attention layers when asked to, which is how
the hybrids are run at a stated cache precision; the searches below only attack pure-GDN models.)

**The argument.** Take two inputs with the same bits, the same keys and the same query suffix ``? q_0 q_1`` that
differ only in values. If their rounded caches are identical after the key-value region, the suffix drives both runs
through identical computations: the logits at the last token are bitwise equal. If the value stored under ``q_p``
differs, the answers differ, so the model is wrong on one of them. The adversary looks for such pairs:

- :func:`forgetting_search`: two inputs differing in the *first* value only, extended by the same random pairs
  until the rounded caches coincide (decay and overwriting contract the difference below half an ulp);
- :func:`birthday_search`: many value assignments on fixed keys, hashing the rounded cache, until two collide;
- :func:`counting_bound`, when the state is too large to search: the cache has ``B`` bits, there are ``R^m`` value
  assignments on ``m`` fixed keys, each pair of which differs under some key; once ``m log2 R > B`` two must share a
  cache (pigeonhole), so a counterexample exists for every such ``m`` (it is not exhibited).

Every exhibited counterexample is verified by re-running the model on both complete inputs (rounding after every
token) and comparing the final logits bit for bit (:func:`verify_counterexample`). The searches exist for both
tasks: single-token keys (:mod:`~lumotree.expressivity.task`) and string keys
(:mod:`~lumotree.expressivity.string_task`: :func:`string_forgetting_search`, :func:`string_birthday_search`,
:func:`string_attack`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..reference.attention import KVCache
from ..reference.config import HybridConfig
from ..reference.fixedpoint import FixedFormat
from ..reference.model import HybridCache, HybridModel, build_random
from .string_task import StringInstance, StringVocabulary, key_string
from .task import BOS, NUM_SPECIAL, ONE, SEP, ZERO, Instance, Vocabulary

__all__ = [
    "PRECISIONS",
    "precision_bits",
    "round_to",
    "RoundedRunner",
    "Counterexample",
    "verify_counterexample",
    "forgetting_search",
    "birthday_search",
    "counting_bound",
    "random_pure_gdn",
    "attack",
    "string_forgetting_search",
    "string_birthday_search",
    "string_error_search",
    "WrongAnswer",
    "string_attack",
]

#: precision name -> (torch dtype name, bits per number)
PRECISIONS = {"fp8": ("float8_e4m3fn", 8), "bf16": ("bfloat16", 16), "fp16": ("float16", 16), "fp32": ("float32", 32)}


def _fixed_format(precision) -> FixedFormat | None:
    if isinstance(precision, FixedFormat):
        return precision
    if isinstance(precision, str) and precision.startswith("fx"):
        return FixedFormat.parse(precision)
    if precision not in PRECISIONS:
        raise ValueError(f"precision = {precision!r}; expected one of {sorted(PRECISIONS)} or a fixed-point format "
                         "'fx<bits>.<frac_bits>'")
    return None


def precision_bits(precision) -> int:
    """Bits per stored number: 8 / 16 / 32 for the float formats, p for ``"fx<p>.<f>"``."""
    fmt = _fixed_format(precision)
    return fmt.bits if fmt is not None else PRECISIONS[precision][1]


def round_to(x: np.ndarray, precision) -> np.ndarray:
    """Round float64 ``x`` to ``precision`` (round to nearest even, saturating at the largest finite value) and
    return it as float64. ``precision``: a float format name, a :class:`~lumotree.reference.fixedpoint.FixedFormat`
    or its name ``"fx<p>.<f>"``."""
    import torch

    fmt = _fixed_format(precision)
    if fmt is not None:
        return fmt.quantize_array(x)
    dtype = getattr(torch, PRECISIONS[precision][0])
    largest = torch.finfo(dtype).max
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64)).clamp(-largest, largest)
    return t.to(dtype).to(torch.float64).numpy()


def _check_pure_gdn(model: HybridModel) -> None:
    if not isinstance(model, HybridModel):
        raise TypeError(f"model must be a HybridModel, got {type(model).__name__}")
    kinds = set(model.config.layer_types)
    if kinds != {"linear_attention"}:
        raise ValueError(f"the adversary needs a pure-GDN model (every layer linear_attention); got layers {kinds}")


class RoundedRunner:
    """Runs a model one token at a time, rounding every cache array to ``precision`` after each token.

    ``pure_gdn=True`` (the adversary's setting) refuses models with attention layers; with ``pure_gdn=False`` the
    KV caches of attention layers are rounded too (a hybrid run at a stated cache precision)."""

    def __init__(self, model: HybridModel, precision, pure_gdn: bool = True):
        if pure_gdn:
            _check_pure_gdn(model)
        elif not isinstance(model, HybridModel):
            raise TypeError(f"model must be a HybridModel, got {type(model).__name__}")
        precision_bits(precision)  # validates
        self.model = model
        self.precision = precision
        self.forward_calls = 0

    def new_cache(self) -> HybridCache:
        return self.model.new_cache()

    def feed(self, tokens: Sequence[int], cache: HybridCache) -> np.ndarray:
        """Advance ``cache`` through ``tokens``; returns the logits ``[vocab]`` after the last one."""
        logits = None
        for token in tokens:
            logits = self.model.forward([int(token)], cache)[-1]
            self.forward_calls += 1
            for layer in cache.layers:
                if isinstance(layer, KVCache):
                    layer.keys = round_to(layer.keys, self.precision)
                    layer.values = round_to(layer.values, self.precision)
                else:
                    layer.conv_state = round_to(layer.conv_state, self.precision)
                    layer.state = round_to(layer.state, self.precision)
        if logits is None:
            raise ValueError("tokens is empty")
        return logits

    @staticmethod
    def fingerprint(cache: HybridCache) -> bytes:
        """The cache's exact content (rounded arrays) as bytes: equal fingerprints = identical caches."""
        return b"".join(np.ascontiguousarray(a).tobytes() for layer in cache.layers
                        for a in ((layer.keys, layer.values) if isinstance(layer, KVCache)
                                  else (layer.conv_state, layer.state)))

    def state_bits(self) -> int:
        """Bits of a pure-GDN model's rounded cache: (conv state + recurrent state) numbers times the precision's
        width (fixed: it does not grow with the input)."""
        _check_pure_gdn(self.model)
        cache = self.model.new_cache()
        numbers = sum(layer.conv_state.size + layer.state.size for layer in cache.layers)
        return numbers * precision_bits(self.precision)


@dataclass
class Counterexample:
    """Two inputs with identical rounded caches after the key-value region and different answers; ``verified``
    once :func:`verify_counterexample` re-ran both and found bitwise-equal final logits."""

    first: Instance | StringInstance
    second: Instance | StringInstance
    strategy: str
    pairs: int
    verified: bool = False
    predictions: tuple[int, int] = (-1, -1)
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        vocab = self.first.vocab
        return {
            "strategy": self.strategy, "pairs": self.pairs, "verified": self.verified,
            "first": self.first.render(), "second": self.second.render(),
            "answers": [vocab.name(self.first.answer), vocab.name(self.second.answer)],
            "predictions": [vocab.name(p) if p >= 0 else None for p in self.predictions], **self.details,
        }


def verify_counterexample(runner: RoundedRunner, ce: Counterexample) -> Counterexample:
    """Re-run both complete inputs from an empty cache (rounding after every token): the caches after the key-value
    region must be identical, the final logits bitwise equal, and the answers different."""
    if ce.first.answer == ce.second.answer:
        raise ValueError("not a counterexample: both inputs have the same answer")
    cut = ce.first.prefix_length  # up to the last value
    if cut != ce.second.prefix_length or not np.array_equal(ce.first.tokens[cut:], ce.second.tokens[cut:]):
        raise ValueError("not a counterexample: the query suffixes differ")
    caches = []
    logits = []
    for inst in (ce.first, ce.second):
        cache = runner.new_cache()
        runner.feed(inst.tokens[:cut], cache)
        caches.append(runner.fingerprint(cache))
        logits.append(runner.feed(inst.tokens[cut:], cache))
    ce.verified = caches[0] == caches[1] and np.array_equal(logits[0], logits[1])
    ce.predictions = (int(np.argmax(logits[0])), int(np.argmax(logits[1])))
    ce.details["logits_bitwise_equal"] = bool(np.array_equal(logits[0], logits[1]))
    ce.details["wrong_on"] = [name for name, inst, pred in (("first", ce.first, ce.predictions[0]),
                                                            ("second", ce.second, ce.predictions[1]))
                              if pred != inst.answer]
    return ce


def _instance(bits, keys, values, differing: int, M: int, R: int) -> Instance:
    """The input that asks for ``keys[differing]`` under the parity of ``bits`` (the other query is any other key)."""
    parity = sum(bits) % 2
    other = keys[1] if differing == 0 else keys[0]
    target = keys[differing]
    queries = (target, other) if parity == 0 else (other, target)
    return Instance(tuple(bits), tuple(keys), tuple(values), queries, M, R)


def _prefix(bits: Sequence[int]) -> list[int]:
    return [BOS, *(ONE if b else ZERO for b in bits), SEP]


def forgetting_search(runner: RoundedRunner, num_keys: int, num_values: int, n: int = 4, max_pairs: int | None = None,
                      trials: int = 4, seed: int = 0) -> Counterexample | None:
    """Two inputs differing only in the first value, extended by identical random pairs until their rounded caches
    coincide (checked after every pair, from the second on). Returns a verified counterexample or None."""
    vocab = Vocabulary(num_keys, num_values)
    if num_values < 2:
        raise ValueError("num_values must be >= 2 for two different answers")
    max_pairs = num_keys if max_pairs is None else min(max_pairs, num_keys)
    if max_pairs < 2:
        raise ValueError("max_pairs must be >= 2")
    rng = np.random.default_rng(seed)
    for _ in range(trials):
        bits = rng.integers(0, 2, n).tolist()
        keys = rng.choice(num_keys, size=max_pairs, replace=False).tolist()
        first_values = rng.choice(num_values, size=2, replace=False).tolist()
        shared = rng.integers(0, num_values, max_pairs).tolist()
        base = runner.new_cache()
        runner.feed(_prefix(bits) + [vocab.key(keys[0])], base)
        caches = []
        for v in first_values:
            cache = base.copy()
            runner.feed([vocab.value(v)], cache)
            caches.append(cache)
        for j in range(1, max_pairs):
            for cache in caches:
                runner.feed([vocab.key(keys[j]), vocab.value(shared[j])], cache)
            if runner.fingerprint(caches[0]) == runner.fingerprint(caches[1]):
                vals = [[v] + shared[1 : j + 1] for v in first_values]
                ce = Counterexample(_instance(bits, keys[: j + 1], vals[0], 0, num_keys, num_values),
                                    _instance(bits, keys[: j + 1], vals[1], 0, num_keys, num_values),
                                    "forgetting", j + 1)
                return verify_counterexample(runner, ce)
    return None


def birthday_search(runner: RoundedRunner, num_keys: int, num_values: int, pairs: int, n: int = 4,
                    samples: int = 2000, seed: int = 0) -> Counterexample | None:
    """Random value assignments on fixed keys and bits; the first two with identical rounded caches after the
    key-value region (and different values) give a counterexample, verified. None if the budget runs out.

    The values of the last two pairs are fixed too: the conv state holds the last ``W - 1 = 3`` tokens exactly, so
    assignments differing there can never collide."""
    vocab = Vocabulary(num_keys, num_values)
    if not 3 <= pairs <= num_keys:
        raise ValueError(f"pairs = {pairs} must be in [3, num_keys = {num_keys}]")
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2, n).tolist()
    keys = rng.choice(num_keys, size=pairs, replace=False).tolist()
    tail = tuple(rng.integers(0, num_values, 2).tolist())
    base = runner.new_cache()
    runner.feed(_prefix(bits), base)
    seen: dict[bytes, tuple[int, ...]] = {}
    for _ in range(samples):
        values = tuple(rng.integers(0, num_values, pairs - 2).tolist()) + tail
        cache = base.copy()
        runner.feed([t for k, v in zip(keys, values) for t in (vocab.key(k), vocab.value(v))], cache)
        print_ = runner.fingerprint(cache)
        other = seen.get(print_)
        if other is not None and other != values:
            i = next(j for j in range(pairs) if other[j] != values[j])
            ce = Counterexample(_instance(bits, keys, other, i, num_keys, num_values),
                                _instance(bits, keys, values, i, num_keys, num_values), "birthday", pairs,
                                details={"samples": len(seen) + 1})
            return verify_counterexample(runner, ce)
        seen.setdefault(print_, values)
    return None


def counting_bound(state_bits: int, num_values: int) -> dict[str, Any]:
    """Pigeonhole: with ``m log2 R > B`` two of the ``R^m`` value assignments share a cache. Returns the smallest
    such ``m`` (the task then needs ``M >= m`` keys)."""
    from .lower_bound import pigeonhole_threshold

    if num_values < 2:
        raise ValueError("num_values must be >= 2")
    per_pair = math.log2(num_values)
    pairs = pigeonhole_threshold(int(state_bits), int(num_values))["pairs"]
    return {"state_bits": state_bits, "bits_per_pair": per_pair, "pairs_for_a_collision": pairs,
            "statement": f"for m >= {pairs} pairs (and M >= m keys) two value assignments share the rounded cache; "
                         "they differ under some key, and querying it makes the model wrong on one of them"}


def random_pure_gdn(num_keys: int, num_values: int, hidden_size: int = 16, layers: int = 1, heads: int = 1,
                    head_dim: int = 4, seed: int = 0, allow_neg_eigval: bool = True) -> HybridModel:
    """A seeded pure-GDN reference model (:func:`~lumotree.reference.model.build_random`) sized for the task."""
    config = HybridConfig(
        vocab_size=NUM_SPECIAL + num_keys + num_values, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=layers, layer_types=("linear_attention",) * layers, linear_num_key_heads=heads,
        linear_num_value_heads=heads, linear_key_head_dim=head_dim, linear_value_head_dim=head_dim,
        num_experts=0, allow_neg_eigval=allow_neg_eigval,
        num_attention_heads=1, num_key_value_heads=1, head_dim=8,
    )
    return build_random(config, seed)


def attack(model: HybridModel, precision: str, num_keys: int, num_values: int, n: int = 4,
           birthday_pairs: int = 6, birthday_samples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Run the adversary on one model: forgetting search, then birthday search, and the counting bound. Returns a
    report with the verified counterexample (if any was found) and the pigeonhole statement."""
    runner = RoundedRunner(model, precision)
    if model.config.vocab_size < NUM_SPECIAL + num_keys + num_values:
        raise ValueError(f"model vocabulary {model.config.vocab_size} is smaller than the task's "
                         f"{NUM_SPECIAL + num_keys + num_values}")
    report: dict[str, Any] = {"precision": precision, "state_bits": runner.state_bits(),
                              "counting": counting_bound(runner.state_bits(), num_values)}
    found = forgetting_search(runner, num_keys, num_values, n=n, seed=seed)
    if found is None or not found.verified:
        found = birthday_search(runner, num_keys, num_values, min(birthday_pairs, num_keys), n=n,
                                samples=birthday_samples, seed=seed)
    report["counterexample"] = None if found is None else found.as_dict()
    report["found"] = bool(found is not None and found.verified)
    report["forward_calls"] = runner.forward_calls
    return report


# ====================================================================================================== string keys
def _string_instance(bits, keys, values, differing: int, num_values: int) -> StringInstance:
    """The PCR-S input that asks for ``keys[differing]`` under the parity of ``bits``."""
    parity = sum(bits) % 2
    other = keys[1] if differing == 0 else keys[0]
    target = keys[differing]
    queries = (target, other) if parity == 0 else (other, target)
    return StringInstance(tuple(bits), tuple(keys), tuple(values), queries, num_values)


def _string_keys(rng: np.random.Generator, count: int, key_length: int) -> list[str]:
    numbers = rng.choice(1 << key_length, size=count, replace=False) if key_length <= 20 else None
    if numbers is not None:
        return [key_string(int(x), key_length) for x in numbers]
    found: dict[str, None] = {}
    while len(found) < count:
        found.setdefault("".join("ab"[b] for b in rng.integers(0, 2, key_length)), None)
    return list(found)


def _check_string_runner(runner: RoundedRunner, num_values: int) -> StringVocabulary:
    _check_pure_gdn(runner.model)
    vocab = StringVocabulary(num_values)
    if num_values < 2:
        raise ValueError("num_values must be >= 2 for two different answers")
    if runner.model.config.vocab_size < vocab.size:
        raise ValueError(f"model vocabulary {runner.model.config.vocab_size} is smaller than the string task's "
                         f"{vocab.size} (8 + R)")
    return vocab


def string_forgetting_search(runner: RoundedRunner, key_length: int, num_values: int, n: int = 4,
                             max_pairs: int | None = None, trials: int = 4, seed: int = 0) -> Counterexample | None:
    """PCR-S: two inputs differing only in the first value, extended by identical random pairs (distinct keys of
    ``key_length`` letters) until their rounded caches coincide. Returns a verified counterexample or None."""
    vocab = _check_string_runner(runner, num_values)
    limit = 1 << key_length if key_length < 30 else 1 << 30
    max_pairs = min(64, limit) if max_pairs is None else min(max_pairs, limit)
    if max_pairs < 2:
        raise ValueError("max_pairs must be >= 2")
    rng = np.random.default_rng(seed)
    for _ in range(trials):
        bits = rng.integers(0, 2, n).tolist()
        keys = _string_keys(rng, max_pairs, key_length)
        first_values = rng.choice(num_values, size=2, replace=False).tolist()
        shared = rng.integers(0, num_values, max_pairs).tolist()
        base = runner.new_cache()
        runner.feed(_prefix(bits) + vocab.letters(keys[0]), base)
        caches = []
        for v in first_values:
            cache = base.copy()
            runner.feed([vocab.value(v)], cache)
            caches.append(cache)
        for j in range(1, max_pairs):
            for cache in caches:
                runner.feed(vocab.letters(keys[j]) + [vocab.value(shared[j])], cache)
            if runner.fingerprint(caches[0]) == runner.fingerprint(caches[1]):
                vals = [[v] + shared[1 : j + 1] for v in first_values]
                ce = Counterexample(_string_instance(bits, keys[: j + 1], vals[0], 0, num_values),
                                    _string_instance(bits, keys[: j + 1], vals[1], 0, num_values),
                                    "forgetting", j + 1)
                return verify_counterexample(runner, ce)
    return None


def string_birthday_search(runner: RoundedRunner, key_length: int, num_values: int, pairs: int, n: int = 4,
                           samples: int = 2000, seed: int = 0) -> Counterexample | None:
    """PCR-S: random value assignments on fixed keys and bits; two with identical rounded caches after the
    key-value region give a verified counterexample. The values of the pairs that reach into the conv window (the
    last ``W - 1`` tokens) are fixed, since the conv state holds those tokens exactly."""
    vocab = _check_string_runner(runner, num_values)
    if not 2 <= pairs <= (1 << min(key_length, 30)):
        raise ValueError(f"pairs = {pairs} must be in [2, 2^key_length]")
    window = runner.model.config.linear_conv_kernel_dim - 1
    fixed = min(pairs - 1, math.ceil(window / (key_length + 1)))
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2, n).tolist()
    keys = _string_keys(rng, pairs, key_length)
    tail = tuple(rng.integers(0, num_values, fixed).tolist())
    base = runner.new_cache()
    runner.feed(_prefix(bits), base)
    seen: dict[bytes, tuple[int, ...]] = {}
    for _ in range(samples):
        values = tuple(rng.integers(0, num_values, pairs - fixed).tolist()) + tail
        cache = base.copy()
        runner.feed([t for k, v in zip(keys, values) for t in (*vocab.letters(k), vocab.value(v))], cache)
        print_ = runner.fingerprint(cache)
        other = seen.get(print_)
        if other is not None and other != values:
            i = next(j for j in range(pairs) if other[j] != values[j])
            ce = Counterexample(_string_instance(bits, keys, other, i, num_values),
                                _string_instance(bits, keys, values, i, num_values), "birthday", pairs,
                                details={"samples": len(seen) + 1})
            return verify_counterexample(runner, ce)
        seen.setdefault(print_, values)
    return None


@dataclass
class WrongAnswer:
    """One input the model answers wrongly at the runner's precision (``verified``: a second run from an empty cache
    gives the same wrong argmax). Weaker evidence than a :class:`Counterexample` pair (it depends on the readout),
    used when caches never coincide bit for bit (float formats keep tiny residues)."""

    instance: StringInstance
    prediction: int
    strategy: str = "wrong answer"
    verified: bool = False

    @property
    def pairs(self) -> int:
        return len(self.instance.keys)

    def as_dict(self) -> dict[str, Any]:
        vocab = self.instance.vocab
        return {"strategy": self.strategy, "pairs": self.pairs, "verified": self.verified,
                "first": self.instance.render(), "answers": [vocab.name(self.instance.answer)],
                "predictions": [vocab.name(self.prediction)]}


def string_error_search(runner: RoundedRunner, key_length: int, num_values: int, pairs: int, n: int = 4,
                        samples: int = 200, seed: int = 0) -> WrongAnswer | None:
    """PCR-S: random instances with ``pairs`` keys of ``key_length`` letters run at the runner's precision; the first
    wrong answer, verified by a second run. None if all ``samples`` are right."""
    _check_string_runner(runner, num_values)
    rng = np.random.default_rng(seed)
    for _ in range(samples):
        keys = _string_keys(rng, pairs, key_length)
        slots = rng.choice(pairs, size=2, replace=False)
        inst = StringInstance(tuple(rng.integers(0, 2, n).tolist()), tuple(keys),
                              tuple(rng.integers(0, num_values, pairs).tolist()),
                              (keys[slots[0]], keys[slots[1]]), num_values)
        prediction = int(np.argmax(runner.feed(inst.tokens, runner.new_cache())))
        if prediction != inst.answer:
            again = int(np.argmax(runner.feed(inst.tokens, runner.new_cache())))
            return WrongAnswer(inst, prediction, verified=again == prediction)
    return None


def string_attack(model: HybridModel, precision, num_values: int, key_length: int, n: int = 4,
                  max_pairs: int | None = None, birthday_pairs: int = 6, birthday_samples: int = 300,
                  seed: int = 0) -> dict[str, Any]:
    """The adversary on one pure-GDN model for PCR-S with keys of ``key_length`` letters: forgetting search (a
    verified pair with bitwise-equal caches), else a direct search for a wrong answer, else birthday search; next to
    the counting bound (the pairs at which a collision must exist, and the key length they need). ``within_bound``
    is true when the verified failure uses no more pairs than the bound."""
    runner = RoundedRunner(model, precision)
    bits = runner.state_bits()
    counting = counting_bound(bits, num_values)
    pairs = counting["pairs_for_a_collision"]
    counting["key_length_needed"] = max(1, math.ceil(math.log2(pairs)))
    counting["statement"] = (f"for m >= {pairs} pairs (keys of >= {counting['key_length_needed']} letters) two "
                             "value assignments share the rounded cache; querying a key where they differ makes the "
                             "model wrong on one of them")
    report: dict[str, Any] = {"precision": precision if isinstance(precision, str) else precision.name,
                              "key_length": key_length, "state_bits": bits, "counting": counting}
    small = min(birthday_pairs, 1 << min(key_length, 30))
    found: Counterexample | WrongAnswer | None = string_forgetting_search(runner, key_length, num_values, n=n,
                                                                          max_pairs=max_pairs, seed=seed)
    if found is None or not found.verified:
        found = string_error_search(runner, key_length, num_values, max(2, small), n=n, seed=seed)
    if found is None or not found.verified:
        found = string_birthday_search(runner, key_length, num_values, small, n=n, samples=birthday_samples, seed=seed)
    report["counterexample"] = None if found is None else found.as_dict()
    report["found"] = bool(found is not None and found.verified)
    report["within_bound"] = bool(report["found"] and found.pairs <= pairs)
    report["forward_calls"] = runner.forward_calls
    return report
