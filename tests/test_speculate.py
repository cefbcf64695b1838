"""The reference speculative decoding loop and its drafters.

Greedy: speculative decoding emits exactly the greedy autoregressive tokens (hypothesis over seeds, dense/MoE models,
drafters, tree budgets) on the real hybrid model. Sampling: the exact enumerator runs the public loop itself under
every coin outcome (on a fast table model with the model API) and the emitted distribution equals autoregressive
sampling; a statistical test does the same on the real hybrid model; the lossy verifier fails both ways.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lumotree.reference.drafters import DraftModelDrafter, NGramDrafter, layer_skip_draft
from lumotree.reference.model import HybridConfig, build_random
from lumotree.reference.speculate import (
    DecodeResult,
    Sampling,
    autoregressive_decode,
    speculative_decode,
)
from lumotree.reference.tree import TokenTree
from lumotree.reference.verify import (
    DraftProposal,
    RandomCoins,
    enumerate_outcomes,
    verify_sampling_lossy_unnormalised_residual,
)

LOSSY = verify_sampling_lossy_unnormalised_residual


def tiny_config(vocab: int = 16, moe: bool = False, layers: int = 4) -> HybridConfig:
    extra = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8, shared_expert_intermediate_size=8) \
        if moe else dict(num_experts=0)
    kinds = ("linear_attention",) * (layers - 1) + ("full_attention",)
    return HybridConfig(
        vocab_size=vocab, hidden_size=16, intermediate_size=16, num_hidden_layers=layers, layer_types=kinds,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, linear_key_head_dim=4, linear_value_head_dim=4,
        linear_num_key_heads=1, linear_num_value_heads=2, **extra,
    )


class TableModel:
    """Test double with the model API (new_cache / forward / verify_tree / commit): logits depend on the last
    ``order`` tokens through a seeded random table. Microseconds per call, so the loop can be enumerated exactly."""

    def __init__(self, vocab: int, seed: int, order: int = 2, scale: float = 1.5):
        self.vocab_size, self.seed, self.order, self.scale = vocab, seed, order, scale
        self.table: dict = {}

    def logits_after(self, seq) -> np.ndarray:
        key = tuple(int(t) for t in seq[-self.order:])
        if key not in self.table:
            rng = np.random.default_rng([self.seed, len(key), *key])
            self.table[key] = rng.standard_normal(self.vocab_size) * self.scale  # [vocab]
        return self.table[key]

    def new_cache(self) -> list[int]:
        return []

    def forward(self, token_ids, cache):
        rows = []
        for t in token_ids:
            cache.append(int(t))
            rows.append(self.logits_after(cache))
        return np.stack(rows)  # [T, vocab]

    def verify_tree(self, tokens, tree, cache):
        return np.stack([self.logits_after(cache + [tokens[j] for j in tree.path(i)])
                         for i in range(tree.num_nodes)])  # [N, vocab]

    def commit(self, tokens, tree, node, cache):
        cache.extend(int(tokens[j]) for j in tree.path(node))


def check_records(result: DecodeResult, prompt: list[int]) -> None:
    """Per-step stats are consistent: accepted paths are tree paths, emitted tokens are the output."""
    out = result.tokens[:1]
    for step in result.steps:
        tree = step.tree
        nodes = step.accepted_nodes
        assert list(nodes) == tree.path(nodes[-1])
        assert tree.tokens[0] == (prompt + out)[-1]
        assert step.result.accepted_tokens == tuple(tree.tokens[i] for i in nodes[1:])
        assert step.accepted_length == len(nodes) - 1
        out = out + list(step.result.emitted)
    assert out[: len(result.tokens)] == result.tokens
    if result.steps:
        assert result.mean_accepted_length == pytest.approx(np.mean([s.accepted_length for s in result.steps]))


# ---------------------------------------------------------------------------------------------------- greedy
@pytest.fixture(scope="module")
def models():
    return {moe: build_random(tiny_config(moe=moe), seed=11) for moe in (False, True)}


@settings(max_examples=12)
@given(
    seed=st.integers(0, 2**31),
    moe=st.booleans(),
    drafter_kind=st.sampled_from(["ngram", "draft-model"]),
    budget=st.integers(1, 10),
    top_k=st.integers(1, 3),
    max_depth=st.integers(1, 4),
    prompt_len=st.integers(1, 10),
)
def test_greedy_speculative_equals_greedy_autoregressive(models, seed, moe, drafter_kind, budget, top_k, max_depth,
                                                         prompt_len):
    model = models[moe]
    rng = np.random.default_rng(seed)
    prompt = [int(t) for t in rng.integers(0, model.vocab_size, prompt_len)]
    if drafter_kind == "ngram":
        drafter = NGramDrafter(budget=budget, max_depth=max_depth)
    else:
        layers = sorted(rng.choice(4, size=int(rng.integers(1, 4)), replace=False).tolist())
        drafter = DraftModelDrafter(layer_skip_draft(model, layers), budget=budget, top_k=top_k, max_depth=max_depth)
    expected = autoregressive_decode(model, prompt, 12).tokens
    result = speculative_decode(model, drafter, prompt, 12)
    assert result.tokens == expected
    check_records(result, prompt)
    assert all(len(s.tree) <= budget for s in result.steps)


def test_identical_draft_accepts_its_whole_chain(models):
    """A draft with all the target's layers proposes the target's greedy chain: every step accepts all of it."""
    model = models[False]
    drafter = DraftModelDrafter(layer_skip_draft(model, [0, 1, 2, 3]), budget=4, top_k=1, max_depth=3)
    result = speculative_decode(model, drafter, [1, 2, 3], 17)
    assert result.tokens == autoregressive_decode(model, [1, 2, 3], 17).tokens
    assert [s.accepted_length for s in result.steps] == [3] * 4
    assert result.mean_tokens_per_step == 4.0


# ---------------------------------------------------------------------------------------------------- sampling, exact
def loop_distribution(run) -> dict:
    return enumerate_outcomes(lambda coins: tuple(run(coins).tokens))


def max_difference(a: dict, b: dict) -> float:
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


@pytest.mark.parametrize("variant", ["iid", "without_replacement", "deterministic"])
def test_sampling_loop_is_lossless_exactly_draft_model(variant):
    target, draft = TableModel(3, seed=1), TableModel(3, seed=2)
    prompt, sampling = [0, 1], Sampling(1.0)
    drafter = DraftModelDrafter(draft, budget=3, top_k=2, max_depth=1, variant=variant)
    ar = loop_distribution(lambda c: autoregressive_decode(target, prompt, 3, sampling, c))
    spec = loop_distribution(lambda c: speculative_decode(target, drafter, prompt, 3, sampling, c))
    assert len(ar) == 27 and max_difference(ar, spec) < 1e-12
    lossy = loop_distribution(lambda c: speculative_decode(target, drafter, prompt, 3, sampling, c, LOSSY))
    assert max_difference(ar, lossy) > 1e-3


def test_sampling_loop_is_lossless_exactly_ngram_and_deep_trees():
    target = TableModel(3, seed=4)
    prompt, sampling = [0, 1, 2, 0, 1, 2, 0, 2, 1, 0], Sampling(0.8)
    drafter = NGramDrafter(budget=4, max_ngram=2, max_depth=2)
    ar = loop_distribution(lambda c: autoregressive_decode(target, prompt, 3, sampling, c))
    spec = loop_distribution(lambda c: speculative_decode(target, drafter, prompt, 3, sampling, c))
    assert max_difference(ar, spec) < 1e-12
    lossy = loop_distribution(lambda c: speculative_decode(target, drafter, prompt, 3, sampling, c, LOSSY))
    assert max_difference(ar, lossy) > 1e-3


# ------------------------------------------------------------------------------------------ sampling, statistics
def chi_square_statistic(samples: list[tuple], exact: dict) -> tuple[float, int]:
    """Pearson's statistic over outcome cells, cells with expected count < 5 pooled; returns (statistic, dof)."""
    n = len(samples)
    counts: dict = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    assert set(counts) <= set(exact), "a sample the target cannot produce"
    cells, pooled_expected, pooled_observed = [], 0.0, 0
    for key, p in exact.items():
        if n * p >= 5:
            cells.append((counts.get(key, 0), n * p))
        else:
            pooled_expected += n * p
            pooled_observed += counts.get(key, 0)
    if pooled_expected > 0:
        cells.append((pooled_observed, pooled_expected))
    return sum((o - e) ** 2 / e for o, e in cells), len(cells) - 1


def chi_square_critical(dof: int, z: float = 3.09) -> float:
    """Upper critical value at one-sided normal quantile z (3.09: p = 0.001), Wilson-Hilferty approximation."""
    a = 2.0 / (9.0 * dof)
    return dof * (1.0 - a + z * math.sqrt(a)) ** 3


def exact_autoregressive(model, prompt: list[int], horizon: int, sampling: Sampling) -> dict:
    """Exact distribution of ``horizon`` sampled tokens, from the model's own logits (one cache per prefix)."""
    cache = model.new_cache()
    rows = model.forward(prompt, cache)
    out: dict = {}

    def walk(prefix: tuple, cache, logits, prob: float) -> None:
        if len(prefix) == horizon:
            out[prefix] = prob
            return
        probs = sampling.probabilities(logits)
        for token in range(model.vocab_size):
            child = cache.copy() if hasattr(cache, "copy") else list(cache)
            next_logits = model.forward([token], child)[-1] if len(prefix) + 1 < horizon else None
            walk(prefix + (token,), child, next_logits, prob * float(probs[token]))

    walk((), cache, rows[-1], 1.0)
    return out


def test_sampling_statistics_match_on_the_hybrid_model():
    model = build_random(tiny_config(vocab=4, layers=2), seed=3)
    prompt, sampling = [1, 2, 3, 1], Sampling(1.0)
    exact = exact_autoregressive(model, prompt, 3, sampling)
    assert abs(sum(exact.values()) - 1) < 1e-12
    drafter = DraftModelDrafter(layer_skip_draft(model, [0]), budget=4, top_k=2, max_depth=2, variant="iid")
    coins = RandomCoins(2024)
    samples = [tuple(speculative_decode(model, drafter, prompt, 3, sampling, coins).tokens) for _ in range(300)]
    statistic, dof = chi_square_statistic(samples, exact)
    assert statistic < chi_square_critical(dof), (statistic, dof)


def test_sampling_statistics_detect_the_lossy_verifier():
    """Same sample size, same test: the lossless verifier passes, the lossy mutant is rejected (here its exact
    chi-square divergence from the target is about 0.2 per sample)."""
    target, draft = TableModel(3, seed=1), TableModel(3, seed=11)
    prompt, sampling = [0, 1], Sampling(1.0)
    drafter = DraftModelDrafter(draft, budget=4, top_k=3, max_depth=1, variant="without_replacement")
    exact = loop_distribution(lambda c: autoregressive_decode(target, prompt, 2, sampling, c))
    for verifier, should_pass in ((None, True), (LOSSY, False)):
        coins = RandomCoins(7)
        kwargs = {} if verifier is None else {"sampling_verifier": verifier}
        samples = [tuple(speculative_decode(target, drafter, prompt, 2, sampling, coins, **kwargs).tokens)
                   for _ in range(400)]
        statistic, dof = chi_square_statistic(samples, exact)
        assert (statistic < chi_square_critical(dof)) == should_pass, (verifier, statistic, dof)


# ---------------------------------------------------------------------------------------------------- drafters
def test_ngram_drafter_proposes_earlier_continuations():
    drafter = NGramDrafter(budget=8, max_ngram=2, max_depth=3)
    context = [5, 6, 7, 8, 5, 6, 9, 1, 5, 6]
    # suffix (5, 6): matches at 4 and 0, most recent first; suffix (6) finds the same continuations again
    assert drafter.continuations(context) == [(9, 1, 5), (7, 8, 5)]
    proposal = drafter.propose(context, None, None)
    assert proposal.variant == "deterministic" and proposal.tree.tokens[0] == 6
    assert len(proposal.tree) <= 8
    first_paths = {tuple(proposal.tree.tokens[j] for j in proposal.tree.path(leaf)[1:]) for leaf in
                   proposal.tree.leaves}
    assert (9, 1, 5) in first_paths and (7, 8, 5) in first_paths
    assert len(NGramDrafter(budget=3).propose(context, None, None).tree) == 3
    assert len(NGramDrafter().propose([1, 2, 3], None, None).tree) == 1  # no match: the root alone


@pytest.mark.parametrize("variant", ["iid", "without_replacement", "deterministic"])
def test_draft_model_drafter_respects_the_budget(variant):
    target = TableModel(6, seed=1)
    drafter = DraftModelDrafter(TableModel(6, seed=2), budget=5, top_k=3, max_depth=3, variant=variant)
    drafter.start([0, 1, 2])
    for seed in range(5):
        proposal = drafter.propose([0, 1, 2, 3], Sampling(1.0), RandomCoins(seed))
        assert isinstance(proposal, DraftProposal) and proposal.variant == variant
        assert len(proposal.tree) <= 5 and proposal.tree.tokens[0] == 3
        if variant != "deterministic":
            assert all(proposal.proposals[u] is not None for u in range(len(proposal.tree))
                       if proposal.tree.children(u))
    greedy = drafter.propose([0, 1, 2, 3], None, None)
    assert greedy.variant == "deterministic" and len(greedy.tree) == 5
    assert target.vocab_size == 6


def test_layer_skip_draft_shares_the_target_weights(models):
    target = models[True]
    draft = layer_skip_draft(target, [1, 3])
    assert draft.config.num_hidden_layers == 2
    assert draft.config.layer_types == (target.config.layer_types[1], target.config.layer_types[3])
    full = layer_skip_draft(target, [0, 1, 2, 3])
    np.testing.assert_array_equal(full.forward([1, 2, 3], full.new_cache()),
                                  target.forward([1, 2, 3], target.new_cache()))
    with pytest.raises(ValueError, match="increasing"):
        layer_skip_draft(target, [2, 1])
    with pytest.raises(ValueError, match=r"layers\[0\] = 9"):
        layer_skip_draft(target, [9])


# ---------------------------------------------------------------------------------------------------- bad input
def test_bad_requests_raise_clear_errors():
    model = TableModel(4, seed=0)
    with pytest.raises(ValueError, match=r"prompt\[1\] = 4"):
        autoregressive_decode(model, [0, 4], 3)
    with pytest.raises(ValueError, match="at least one token"):
        speculative_decode(model, NGramDrafter(), [], 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        speculative_decode(model, NGramDrafter(), [0], -1)
    with pytest.raises(ValueError, match="temperature"):
        Sampling(0.0)
    with pytest.raises(TypeError, match="sampling"):
        speculative_decode(model, NGramDrafter(), [0], 3, sampling=0.7)
    with pytest.raises(ValueError, match="budget"):
        NGramDrafter(budget=0)
    with pytest.raises(ValueError, match="variant"):
        DraftModelDrafter(model, variant="top_p")

    class WrongRoot(NGramDrafter):
        def propose(self, context, sampling, coins):
            return DraftProposal(TokenTree([-1], [(context[-1] + 1) % 4]), "deterministic")

    with pytest.raises(ValueError, match="not the pending token"):
        speculative_decode(model, WrongRoot(), [0, 1], 3)
    assert speculative_decode(model, NGramDrafter(), [0], 0).tokens == []


# ---------------------------------------------------------------------------------------------------- temperature
@pytest.mark.parametrize("temperature", [1e-300, 5e-324, 1e-305])
def test_a_vanishing_temperature_samples_greedily(temperature):
    """logits / temperature would overflow (inf - inf = NaN): the maximum is subtracted first, so the probabilities
    are the greedy limit, a point mass on the argmax (even split between exact ties), and sampling emits greedy
    tokens."""
    sampling = Sampling(temperature)
    probs = sampling.probabilities(np.array([[1e10, 3e10, -2e10, 3e10], [0.5, -np.inf, 0.25, 0.0]]))
    np.testing.assert_array_equal(probs, [[0, 0.5, 0, 0.5], [1, 0, 0, 0]])
    model = TableModel(5, seed=3)
    greedy = autoregressive_decode(model, [0, 1], 8).tokens
    assert autoregressive_decode(model, [0, 1], 8, sampling=sampling, coins=RandomCoins(1)).tokens == greedy
    assert speculative_decode(model, NGramDrafter(), [0, 1, 0, 1], 8, sampling=sampling).tokens == \
        autoregressive_decode(model, [0, 1, 0, 1], 8).tokens


def test_nan_logits_and_nan_probabilities_raise_instead_of_sampling():
    with pytest.raises(ValueError, match=r"^logits contain NaN"):
        Sampling(0.7).probabilities(np.array([0.0, np.nan]))
    with pytest.raises(ValueError, match=r"^logits have a row without a finite entry"):
        Sampling(0.7).probabilities(np.array([-np.inf, -np.inf]))
    coins = RandomCoins(0)
    with pytest.raises(ValueError, match=r"^categorical\(probs\): probs\[1\] is NaN"):
        coins.categorical([0.5, float("nan"), 0.5])
    with pytest.raises(ValueError, match=r"^bernoulli\(p\): p = nan"):
        coins.bernoulli(float("nan"))
    with pytest.raises(ValueError, match=r"bernoulli\(p\) needs 0 <= p <= 1, got p = nan"):
        enumerate_outcomes(lambda c: c.bernoulli(float("nan")))
    with pytest.raises(ValueError, match=r"probs\[0\] = nan is negative or not a number"):
        enumerate_outcomes(lambda c: c.categorical([float("nan"), 1.0]))
