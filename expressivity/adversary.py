r"""Pure GDN, an executable lower bound: concrete counterexamples for a given pure-GDN model at a stated precision.

**Setting.** A pure-GDN reference model (every layer ``linear_attention``) whose cache is rounded to a stated
precision after every token: ``fp8`` (e4m3), ``bf16``, ``fp16`` or ``fp32``, saturating at the format's largest
finite value. Its cache after a prefix is everything the model carries forward: per layer the conv state
``[W - 1, C]`` and the recurrent state ``[HV, K, V]``.

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
token) and comparing the final logits bit for bit (:func:`verify_counterexample`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..reference.config import HybridConfig
from ..reference.model import HybridCache, HybridModel, build_random
from .task import BOS, NUM_SPECIAL, ONE, SEP, ZERO, Instance, Vocabulary

__all__ = [
    "PRECISIONS",
    "round_to",
    "RoundedRunner",
    "Counterexample",
    "verify_counterexample",
    "forgetting_search",
    "birthday_search",
    "counting_bound",
    "random_pure_gdn",
    "attack",
]

#: precision name -> (torch dtype name, bits per number)
PRECISIONS = {"fp8": ("float8_e4m3fn", 8), "bf16": ("bfloat16", 16), "fp16": ("float16", 16), "fp32": ("float32", 32)}


def round_to(x: np.ndarray, precision: str) -> np.ndarray:
    """Round float64 ``x`` to ``precision`` (round to nearest even, saturating at the largest finite value) and
    return it as float64."""
    import torch

    if precision not in PRECISIONS:
        raise ValueError(f"precision = {precision!r}; expected one of {sorted(PRECISIONS)}")
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
    """Runs a pure-GDN model one token at a time, rounding every cache array to ``precision`` after each token."""

    def __init__(self, model: HybridModel, precision: str):
        _check_pure_gdn(model)
        if precision not in PRECISIONS:
            raise ValueError(f"precision = {precision!r}; expected one of {sorted(PRECISIONS)}")
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
                layer.conv_state = round_to(layer.conv_state, self.precision)
                layer.state = round_to(layer.state, self.precision)
        if logits is None:
            raise ValueError("tokens is empty")
        return logits

    @staticmethod
    def fingerprint(cache: HybridCache) -> bytes:
        """The cache's exact content (rounded arrays) as bytes: equal fingerprints = identical caches."""
        return b"".join(a.tobytes() for layer in cache.layers for a in (layer.conv_state, layer.state))

    def state_bits(self) -> int:
        """Bits of the rounded cache: (conv state + recurrent state) numbers times the precision's width."""
        cache = self.model.new_cache()
        numbers = sum(layer.conv_state.size + layer.state.size for layer in cache.layers)
        return numbers * PRECISIONS[self.precision][1]


@dataclass
class Counterexample:
    """Two inputs with identical rounded caches after the key-value region and different answers; ``verified``
    once :func:`verify_counterexample` re-ran both and found bitwise-equal final logits."""

    first: Instance
    second: Instance
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
    cut = len(ce.first.tokens) - 3  # up to the last value
    if not np.array_equal(ce.first.tokens[cut:], ce.second.tokens[cut:]):
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
    if num_values < 2:
        raise ValueError("num_values must be >= 2")
    per_pair = math.log2(num_values)
    pairs = math.floor(state_bits / per_pair) + 1
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
