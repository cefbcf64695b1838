"""The engine on the CPU: continuous batching over slots, speculation modes, budget decisions, losslessness, bad input.

Models: the exact float64 reference model behind :class:`ReferenceTarget` (greedy equality checks), and a trigram
test double (``TrigramTarget``: logits after ``... a b`` are ``table[a, b]``), batched in torch, fast enough for
chi-square tests over thousands of requests. The double is a model in the engine's protocol, nothing more: it keeps
the last two committed tokens per slot and computes tree logits from each node's parent token and its own.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lumotree.optimized.engine import sampling
from lumotree.optimized.engine.budget import (
    CostProfile,
    ExpectedThroughputBudget,
    FixedBudget,
    RatioRuleBudget,
    cumulative_confidences,
    batch_expected_tokens,
    expected_tokens,
)
from lumotree.optimized.engine.drafters import (
    Draft,
    DraftRequest,
    DraftModelDrafter,
    PromptLookupDrafter,
    SyntheticDrafter,
    best_first_template,
    make_drafter,
)
from lumotree.optimized.engine import Engine, ReferenceTarget
from lumotree.optimized.engine.sampling import SamplingParams, TreeBatch
from lumotree.reference.drafters import layer_skip_draft
from lumotree.reference.model import HybridConfig, build_random
from strategies import chi_square_pvalue


# ================================================================================================== test doubles
class TrigramTarget:
    """A model in the engine's protocol whose next-token logits depend on the last two tokens."""

    def __init__(self, vocab: int = 5, num_slots: int = 8, max_seq_len: int = 64, seed: int = 0, scale: float = 1.5):
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(vocab + 1, vocab, vocab, generator=g, dtype=torch.float64) * scale  # [V+1, V, V]
        self.vocab_size = vocab
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        self.max_nodes = 128
        self.device = torch.device("cpu")
        self.prev = torch.full((num_slots,), vocab, dtype=torch.int64)  # second-to-last committed (vocab = none)
        self.last = torch.zeros(num_slots, dtype=torch.int64)  # last committed token
        self.length = torch.zeros(num_slots, dtype=torch.int64)
        self.live = [False] * num_slots
        self.calls = {"prefill": 0, "decode": 0, "verify": 0, "commit": 0}

    def logits_after(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.table[a, b]  # [..., V]

    def prefill(self, slot, tokens):
        assert not self.live[slot], "prefill into a slot that was not released"
        self.calls["prefill"] += 1
        self.live[slot] = True
        self.prev[slot] = tokens[-2] if len(tokens) > 1 else self.vocab_size
        self.last[slot] = tokens[-1]
        self.length[slot] = len(tokens)
        return self.logits_after(self.prev[slot], self.last[slot])

    def decode(self, slots, tokens):
        self.calls["decode"] += 1
        assert all(self.live[s] for s in slots.tolist())
        logits = self.logits_after(self.last[slots], tokens)  # [B, V]
        self.prev[slots] = self.last[slots]
        self.last[slots] = tokens
        self.length[slots] += 1
        assert int(self.length.max()) <= self.max_seq_len
        return logits

    def verify(self, slots, trees: TreeBatch):
        self.calls["verify"] += 1
        self._given = trees
        trees = trees.to(self.device)
        assert all(self.live[s] for s in slots.tolist())
        parent_tok = trees.tokens.gather(1, trees.parents.clamp(min=0))  # [B, N]
        parent_tok[:, 0] = self.last[slots]
        assert int((self.length[slots] + trees.depth.max(1).values).max()) < self.max_seq_len
        self._trees = trees
        return self.logits_after(parent_tok, trees.tokens)  # [B, N, V]

    def commit(self, slots, trees, accepted):
        self.calls["commit"] += 1
        assert trees is self._given
        trees, accepted = self._trees, accepted.to(self.device)
        rows = torch.arange(len(slots), device=self.device)
        depth = trees.depth[rows, accepted]  # [B]
        new_last = trees.tokens[rows, accepted]  # [B]
        parent_tok = trees.tokens[rows, trees.parents[rows, accepted].clamp(min=0)]  # [B]
        new_prev = torch.where(depth >= 1, parent_tok, self.last[slots])
        self.prev[slots], self.last[slots] = new_prev, new_last
        self.length[slots] += depth + 1

    def release(self, slot):
        assert self.live[slot]
        self.live[slot] = False

    def exact_autoregressive(self, prompt, horizon, temperature=1.0, top_k=0, top_p=1.0):
        """Exact distribution of the first ``horizon`` sampled tokens: {tokens: probability}."""
        V = self.vocab_size
        out = {}
        for seq in itertools.product(range(V), repeat=horizon):
            a, b = (prompt[-2] if len(prompt) > 1 else V), prompt[-1]
            p = 1.0
            for tok in seq:
                probs = sampling.target_probs(
                    self.logits_after(torch.tensor(a), torch.tensor(b))[None, None],
                    torch.tensor([temperature], dtype=torch.float64),
                    torch.tensor([top_k]),
                    torch.tensor([top_p], dtype=torch.float64),
                )[0, 0]
                p *= float(probs[tok])
                a, b = b, tok
            out[seq] = p
        return out


class SampledTableDrafter:
    """Draws trees from a fixed trigram proposal table (``iid`` with repeated draws, ``without_replacement``, or
    ``deterministic``: the most probable tokens first), recording the proposals, as a sampling drafter must. Shape:
    ``width`` draws at the root, ``width`` at the first child, then a chain."""

    name = "sampled-table"
    description = "test drafter: sampled proposals from a fixed table"
    synthetic = False

    def __init__(self, vocab: int, variant: str, width: int = 3, seed: int = 7):
        g = torch.Generator().manual_seed(seed)
        self.q = torch.softmax(torch.randn(vocab + 1, vocab, vocab, generator=g, dtype=torch.float64), -1)
        self.variant = variant
        self.width = width
        self.vocab = vocab
        self.rng = np.random.default_rng(seed)

    def admit(self, slot, prompt):
        pass

    def release(self, slot):
        pass

    def advance(self, requests, committed):
        pass

    def propose(self, requests, max_nodes, chain):
        drafts = []
        for r in requests:
            ctx = r.context
            tokens, parents = [ctx[-1]], [-1]
            prev_of = {0: ctx[-2] if len(ctx) > 1 else self.vocab}
            proposal = []
            draws = [[]]

            def q_at(node):
                return self.q[prev_of[node], tokens[node]]

            def draw_children(u, count):
                q = q_at(u)
                remaining = q.clone()
                for _ in range(count):
                    if self.variant == "deterministic":
                        tok = int(remaining.argmax())
                    else:
                        dist = remaining / remaining.sum() if self.variant == "without_replacement" else q
                        tok = int(np.searchsorted(np.cumsum(dist.numpy()), self.rng.random() * float(dist.sum()),
                                                  side="right"))
                    existing = next((c for c in draws[u] if tokens[c] == tok), None)
                    if existing is None:
                        existing = len(tokens)
                        tokens.append(tok)
                        parents.append(u)
                        prev_of[existing] = tokens[u]
                        draws.append([])
                    draws[u].append(existing)
                    remaining[tok] = 0
                    if remaining.sum() <= 0:
                        break

            draw_children(0, self.width)
            first = draws[0][0]
            draw_children(first, self.width)
            node = draws[first][0]
            for _ in range(2):
                draw_children(node, 1)
                node = draws[node][0]
            for u in range(len(tokens)):
                proposal.append(q_at(u) if u in prev_of else torch.zeros(self.vocab, dtype=torch.float64))
            deterministic = self.variant == "deterministic"
            drafts.append(Draft(tokens, parents, 0.5 ** np.array([0] + [1] * (len(tokens) - 1)), self.variant,
                                None if deterministic else torch.stack(proposal),
                                None if deterministic else [list(d) for d in draws]))
        return drafts


def flat_profile(decode=1.0, verify=lambda b, n: 1.0, batches=(1, 2, 4, 8, 16, 32, 64), nodes=(1, 2, 4, 8, 16, 32, 64)):
    return CostProfile(batches, nodes, {b: decode for b in batches},
                       {(b, n): verify(b, n) for b in batches for n in nodes})


# ================================================================================================== fixtures
@pytest.fixture(scope="module")
def tiny_reference():
    config = HybridConfig(
        vocab_size=48, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=8, linear_value_head_dim=8, num_experts=0,
        layer_types=("linear_attention", "full_attention"),
    )
    return build_random(config, seed=3)


def prompts_for(vocab: int, count: int, seed: int = 0, repeat: bool = True) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        base = rng.integers(0, vocab, size=int(rng.integers(2, 6))).tolist()
        out.append(base * 3 if repeat and i % 2 == 0 else base + rng.integers(0, vocab, size=4).tolist())
    return out


# ================================================================================================== greedy equality
def test_greedy_speculation_equals_autoregressive_on_the_reference(tiny_reference):
    """Greedy chain and tree speculation (n-gram, draft model, synthetic drafters) emit exactly the tokens of greedy
    autoregressive decoding of the same engine; more prompts than slots (queueing, slots reused), mixed lengths."""
    model = tiny_reference
    prompts = prompts_for(model.vocab_size, 5)
    params = [SamplingParams(max_new_tokens=n) for n in (12, 7, 12, 3, 10)]
    ar_engine = Engine(ReferenceTarget(model, num_slots=2, max_seq_len=64), mode="autoregressive")
    reference = ar_engine.generate(prompts, params)
    assert [len(r.tokens) for r in reference] == [12, 7, 12, 3, 10]
    oracle = {tuple(p): r.tokens for p, r in zip(prompts, reference)}
    drafters = {
        "ngram": lambda: PromptLookupDrafter(),
        "draft-model": lambda: DraftModelDrafter(
            ReferenceTarget(layer_skip_draft(model, (0,)), num_slots=2, max_seq_len=64), top_k=2, max_depth=3
        ),
        "synthetic": lambda: SyntheticDrafter(0.8, oracle, model.vocab_size, seed=1),
    }
    for mode in ("chain", "tree"):
        for name, build in drafters.items():
            engine = Engine(ReferenceTarget(model, num_slots=2, max_seq_len=64), build(), mode=mode,
                            budget="fixed", max_nodes=8)
            got = engine.generate(prompts, params)
            assert [r.tokens for r in got] == [r.tokens for r in reference], (mode, name)
            assert sorted(engine.free_slots) == [0, 1] and not engine.running
            if name == "synthetic":
                assert engine.stats.summary()["mean_accepted"] > 1.0


def test_synthetic_acceptance_is_calibrated():
    """The synthetic drafter's chains accept each token with probability p: mean accepted length of a k-token chain
    is sum_{d=1..k} p^d; its confidences predict the tree's accepted tokens."""
    target = TrigramTarget(vocab=5, num_slots=64, max_seq_len=200)
    prompts = prompts_for(5, 64, seed=2)
    ar = Engine(target, mode="autoregressive").generate(prompts, SamplingParams(max_new_tokens=60))
    oracle = {tuple(p): r.tokens for p, r in zip(prompts, ar)}
    p = 0.7
    for chain, nodes in ((True, 5), (False, 12)):
        target = TrigramTarget(vocab=5, num_slots=64, max_seq_len=200)
        drafter = SyntheticDrafter(p, oracle, 5, seed=3)
        engine = Engine(target, drafter, mode="chain" if chain else "tree", budget="fixed", max_nodes=nodes)
        out = engine.generate(prompts, SamplingParams(max_new_tokens=60))
        assert [r.tokens for r in out] == [r.tokens for r in ar]
        verify_steps = [s for s in engine.stats.steps if s.kind == "verify"]
        accepted = sum(s.accepted for s in verify_steps) / sum(s.batch for s in verify_steps)
        _, _, conf = best_first_template(nodes, [p] if chain else [p * (1 - p) ** r for r in range(4)])
        predicted = sum(conf[1:])
        # requests near their end cut nothing (fixed budget), so the prediction holds up to sampling noise
        assert abs(accepted - predicted) < 0.12 * predicted, (chain, accepted, predicted)
        if chain:
            assert abs(predicted - sum(p**d for d in range(1, nodes))) < 1e-12
    assert drafter.desynced == 0


def test_synthetic_drafter_follows_the_oracle_until_a_request_leaves_it():
    """Requests whose outputs follow the oracle get its next tokens on their drafts' paths at every step (only the
    new tokens are compared each step); one that leaves it is counted desynced at every later step, gets no oracle
    tokens, and is back in sync after its slot is released and admitted again."""
    prompts = prompts_for(5, 2, seed=4)
    truth = [int(t) for t in np.random.default_rng(5).integers(0, 1000, 30)]
    drafter = SyntheticDrafter(1 - 1e-9, {tuple(p): truth for p in prompts}, 1000, seed=1)
    for slot, prompt in enumerate(prompts):
        drafter.admit(slot, prompt)

    def step(outputs):  # each output ends with its pending token
        requests = [DraftRequest(s, list(p) + out, SamplingParams())
                    for s, (p, out) in enumerate(zip(prompts, outputs))]
        return drafter.propose(requests, 8, True)  # chains: node d holds the draft's guess d steps ahead

    for done in range(1, 6):
        drafts = step([truth[:done], truth[:done]])
        for d in drafts:  # acceptance 1 - 1e-9: every chain node hits
            assert d.tokens[1:] == truth[done : done + 7]
    assert drafter.desynced == 0
    off = truth[:5] + [(truth[5] + 1) % 1000]
    for extra in range(3):
        drafts = step([truth[: 6 + extra], off + truth[6 : 6 + extra]])
        assert drafts[0].tokens[1:] == truth[6 + extra : 13 + extra]
        assert drafts[1].tokens[1:] != truth[6 + extra : 13 + extra]
        assert drafter.desynced == extra + 1
    drafter.release(1)
    drafter.admit(1, prompts[1])
    assert step([truth[:3], truth[:3]])[1].tokens[1:] == truth[3:10] and drafter.desynced == 3


@pytest.mark.parametrize("nodes,chain", [(1, False), (12, False), (64, False), (7, True)])
def test_synthetic_drafts_are_best_first_as_they_claim(nodes, chain):
    """The synthetic drafter marks its drafts best-first (so cuts and the budget's sort skip the check): the claim
    holds, and the cut and the sorted confidences equal those of the same draft without the claim."""
    prompts = prompts_for(5, 4, seed=1)
    oracle = {tuple(p): [1, 2, 3, 4, 0] * 10 for p in prompts}
    drafter = SyntheticDrafter(0.6, oracle, 5, seed=2)
    for slot, prompt in enumerate(prompts):
        drafter.admit(slot, prompt)
    requests = [DraftRequest(slot, list(p) + [1], SamplingParams()) for slot, p in enumerate(prompts)]
    for draft in drafter.propose(requests, nodes, chain):
        assert draft.best_first is True and bool(np.all(np.diff(draft.confidence[1:]) <= 0))
        plain = Draft(draft.tokens, draft.parents, draft.confidence)  # best_first unknown: computed
        np.testing.assert_array_equal(draft.sorted_confidences(), np.sort(plain.confidence[1:])[::-1])
        for n, depth in ((1, None), (5, None), (5, 2), (nodes, 1)):
            cut, ref = draft.cut(n, depth), plain.cut(n, depth)
            assert (cut.tokens, cut.parents) == (ref.tokens, ref.parents)
            np.testing.assert_array_equal(cut.confidence, ref.confidence)


# ================================================================================================== losslessness
def _first_tokens(engine: Engine, prompt, copies: int, params: SamplingParams, horizon: int) -> dict:
    results = engine.generate([prompt] * copies, [
        SamplingParams(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, seed=i,
                       max_new_tokens=horizon) for i in range(copies)
    ])
    counts: dict = {}
    for r in results:
        counts[tuple(r.tokens)] = counts.get(tuple(r.tokens), 0) + 1
    return counts


@pytest.mark.parametrize(
    "variant, params, copies, check_lossy",
    [
        ("deterministic", SamplingParams(temperature=1.0), 1000, True),
        ("without_replacement", SamplingParams(temperature=0.8, top_k=3), 1000, False),
        ("iid", SamplingParams(temperature=1.2, top_p=0.9), 3000, True),
    ],
)
def test_sampling_through_the_engine_matches_autoregressive(variant, params, copies, check_lossy, monkeypatch):
    """Chi-square: the first 3 tokens of tree speculation (drafts with several draws per node, repeated draws for
    ``iid``) follow the exact autoregressive distribution; so do plain autoregressive samples of the same engine; a
    verifier that skips the residual renormalisation fails the same test."""
    V, horizon = 4, 3
    prompt = [1, 2, 3, 1, 2]
    target = TrigramTarget(vocab=V, num_slots=1, seed=5)
    exact = target.exact_autoregressive(prompt, horizon, params.temperature, params.top_k, params.top_p)
    keys = sorted(exact)
    expected = np.array([exact[k] for k in keys])

    def run(drafter) -> np.ndarray:
        engine = Engine(TrigramTarget(vocab=V, num_slots=1024, max_seq_len=32, seed=5), drafter,
                        mode="tree" if drafter else "autoregressive", budget="fixed", max_nodes=16, seed=1)
        counts = _first_tokens(engine, prompt, copies, params, horizon)
        assert set(counts) <= set(keys)
        if drafter is not None:
            assert sum(s.accepted for s in engine.stats.steps) > copies // 4  # drafts really were accepted
        return np.array([counts.get(k, 0) for k in keys], dtype=np.float64)

    assert chi_square_pvalue(run(SampledTableDrafter(V, variant)), expected) > 1e-3
    assert chi_square_pvalue(run(None), expected) > 1e-3
    if check_lossy and variant == "deterministic":
        # deterministic drafts draw each node's token with its output position's coin: one coin for every depth
        # of a tree (positions forgotten) couples the step's tokens, and the test sees it
        real = Engine.position_coins
        monkeypatch.setattr(Engine, "position_coins", lambda self, requests, offsets: real(self, requests, 0 * offsets))
        assert chi_square_pvalue(run(SampledTableDrafter(V, variant)), expected) < 1e-4
    elif check_lossy:

        def lossy(residual, proposal):
            r = (residual - proposal).clamp(min=0)
            return torch.where(r.sum(-1, keepdim=True) > 0, r, residual)

        monkeypatch.setattr(sampling, "residual_after_rejection", lossy)
        assert chi_square_pvalue(run(SampledTableDrafter(V, variant)), expected) < 1e-4


# ================================================================================================== batching, slots
def test_continuous_batching_joins_and_leaves_between_steps():
    target = TrigramTarget(vocab=6, num_slots=3, max_seq_len=40)
    engine = Engine(target, PromptLookupDrafter(), mode="tree", budget="fixed", max_nodes=4)
    lengths = [3, 9, 5, 2, 7, 4, 6]
    ids = [engine.submit([1, 2, 3, 4][: 1 + i % 4], SamplingParams(max_new_tokens=n)) for i, n in enumerate(lengths)]
    seen_batches = []
    done: dict[int, list[int]] = {i: [] for i in ids}
    finished_order = []
    while engine.has_work():
        for event in engine.step():
            done[event.request_id].extend(event.tokens)
            if event.finished:
                finished_order.append(event.request_id)
        seen_batches.append(len(engine.running))
        assert len(engine.running) <= 3
        assert len(engine.free_slots) + len(engine.running) == 3
        assert sorted(r.slot for r in engine.running) == sorted(set(r.slot for r in engine.running))
    assert [len(done[i]) for i in ids] == lengths
    assert finished_order != sorted(finished_order)  # short requests left early and others joined
    assert target.calls["prefill"] == len(lengths)
    assert not any(target.live)
    assert sorted(engine.free_slots) == [0, 1, 2]


def test_stop_tokens_and_context_limit():
    target = TrigramTarget(vocab=6, num_slots=4, max_seq_len=12)
    engine = Engine(target, PromptLookupDrafter(), mode="tree", budget="fixed", max_nodes=8)
    ar_engine = Engine(TrigramTarget(vocab=6, num_slots=4, max_seq_len=12), mode="autoregressive")
    prompt = [1, 2, 1, 2, 1, 2]
    free_run = ar_engine.generate([prompt], SamplingParams(max_new_tokens=100))[0]
    assert free_run.finish_reason == "length" and len(prompt) + len(free_run.tokens) == 12
    stop = free_run.tokens[2]
    got = engine.generate([prompt, prompt], [SamplingParams(max_new_tokens=100),
                                             SamplingParams(max_new_tokens=100, stop_token_ids=(stop,))])
    assert got[0].tokens == free_run.tokens and got[0].finish_reason == "length"
    cut = free_run.tokens.index(stop) + 1
    assert got[1].tokens == free_run.tokens[:cut] and got[1].finish_reason == "stop"


# ================================================================================================== budget
def test_budget_decisions_follow_costs_and_confidences():
    conf_good = [np.sort(np.full(63, 0.9) ** np.arange(1, 64))[::-1]]
    # verify cost grows with N: 1 + N/16 decode units at B=1; huge at B=64
    profile = flat_profile(verify=lambda b, n: 1.0 + n * b / 16.0)
    budget = ExpectedThroughputBudget(profile)
    d = budget.choose(1, conf_good, 0.0)
    rates = {n: (1 + sum(conf_good[0][: n - 1])) / (1 + n / 16) for n in profile.node_buckets}
    assert d.nodes == max(rates, key=rates.get) and d.nodes > 1
    d64 = budget.choose(64, conf_good * 64, 0.0)
    assert d64.autoregressive  # at B=64 every tree costs more than it gains
    useless = [np.zeros(63)]
    assert budget.choose(1, useless, 0.0).autoregressive
    # baseline rule: largest N with T_verify <= (1 + eps) T_decode
    ratio = RatioRuleBudget(profile, eps=0.5)
    assert ratio.choose(1, conf_good, 0.0).nodes == 8  # 1 + 8/16 = 1.5
    assert ratio.choose(8, conf_good, 0.0).autoregressive  # 1 + 8*2/16 > 1.5 already at N = 2
    assert FixedBudget(profile, 16).choose(64, useless, 0.0).nodes == 16


@pytest.mark.parametrize("lengths", [[5, 5, 5], [0, 3, 7], [4], [0, 0]])
def test_cumulative_confidences_table(lengths):
    """Column m of the budget's table = the sum of each request's m largest confidences, rows past their length
    padded with their total (one draft size takes the stacked path, mixed sizes the per-row one)."""
    rng = np.random.default_rng(sum(lengths))
    confidences = [np.sort(rng.random(n))[::-1] for n in lengths]
    table = cumulative_confidences(confidences)
    width = max(lengths)
    assert table.shape == (len(lengths), width + 1)
    for b, c in enumerate(confidences):
        for m in range(width + 1):
            assert abs(table[b, m] - c[:m].sum()) < 1e-12


@pytest.mark.parametrize("lengths", [[5, 5, 5], [0, 3, 7], [4], [0, 0]])
def test_batch_expected_tokens_is_the_sum_over_requests(lengths):
    """The fixed and ratio budgets' batch total from one table equals the per-request sum of ``expected_tokens``
    at every tree size (smaller, equal and larger than the drafts)."""
    rng = np.random.default_rng(7 + sum(lengths))
    confidences = [np.sort(rng.random(n))[::-1] for n in lengths]
    for nodes in range(1, max(lengths) + 4):
        want = sum(expected_tokens(c, nodes) for c in confidences)
        assert abs(batch_expected_tokens(confidences, nodes) - want) < 1e-12


def test_budget_calibration_probes_and_backoff():
    profile = flat_profile(verify=lambda b, n: 1.0 + n * b / 64.0)
    budget = ExpectedThroughputBudget(profile)
    confident = [np.full(15, 0.9)]
    d = budget.choose(1, confident, 0.0)
    assert not d.autoregressive and budget.kappa == 1.0
    for _ in range(30):  # the drafter claims 0.9 per node but nothing is ever accepted
        budget.observe(d, predicted_accepted=13.5, accepted=0.0, draft_seconds=0.0)
    assert budget.kappa < 0.01
    # from now on: a probe at each drafting moment, with 1, 2, 4, 8 drafting-free steps in between
    pattern = []
    for _ in range(20):
        if budget.want_draft(1):
            decision = budget.choose(1, confident, 0.0)
            assert not decision.autoregressive and decision.reason.startswith("probe")
            pattern.append("P")
        else:
            pattern.append(".")
    assert "".join(pattern) == "P.P..P....P........P"
    # drafts become good: one observed success restores the calibration and speculation
    budget.observe(d, predicted_accepted=13.5, accepted=13.0, draft_seconds=0.0)
    while not budget.want_draft(1):
        pass
    assert not budget.choose(1, confident, 0.0).reason.startswith("probe")
    assert budget.backoff == 1
    # cost-dominated (B = 64 here): decode without probing, whatever the confidences
    assert budget.choose(64, [np.full(15, 0.99)] * 64, 0.0).autoregressive


def test_budget_amortizes_expensive_drafts():
    """A draft that costs 3 decode steps and does not pay: drafting pauses for at least 3 / 0.05 = 60 steps, so the
    wasted drafts stay near 5 % of the time; a free draft keeps the plain backoff (1, 2, 4, ..)."""
    profile = flat_profile(verify=lambda b, n: 1.0 + n / 16.0)
    budget = ExpectedThroughputBudget(profile, probe_cost_fraction=0.05)
    useless = [np.zeros(15)]
    assert budget.choose(1, useless, draft_seconds=3.0).autoregressive
    assert budget.skip_remaining == 60
    assert sum(not budget.want_draft(1) for _ in range(60)) == 60 and budget.want_draft(1)
    free = ExpectedThroughputBudget(profile)
    free.choose(1, useless, draft_seconds=0.0)
    assert free.skip_remaining == 1
    with pytest.raises(ValueError, match="probe_cost_fraction"):
        ExpectedThroughputBudget(profile, probe_cost_fraction=0.0)


def test_budget_keeps_drafting_when_verified_drafts_save_more_than_declined_ones_cost():
    """A cheap drafter whose matches come and go (one verified draft that saved time, then a useless one) drafts
    again at the next step; a draft that costs more than the verified ones saved backs off as before."""
    profile = flat_profile(verify=lambda b, n: 1.0 + n / 64.0)
    good, useless = [np.full(15, 0.9)], [np.zeros(15)]
    for draft_seconds, skipped in ((0.05, 0), (50.0, 1000)):
        budget = ExpectedThroughputBudget(profile, probe_cost_fraction=0.05)
        decision = budget.choose(1, good, draft_seconds)
        assert not decision.autoregressive
        budget.observe(decision, predicted_accepted=13.5, accepted=12.0, draft_seconds=draft_seconds)
        # 13 tokens for a 1.2 s step (and its draft) against 13 decode steps of 1 s
        assert (budget.gain_ema > 0) == (skipped == 0)
        assert budget.choose(1, useless, draft_seconds).autoregressive
        assert budget.skip_remaining == skipped
        assert budget.want_draft(1) == (skipped == 0)


def test_budget_time_calibration_from_measured_steps():
    """Measured step times scale the profile: verify steps that take 3x their profiled time make a tree that paid
    on paper lose to decoding; decode steps that are slow make speculation pay again."""
    profile = flat_profile(verify=lambda b, n: 1.0 + n / 16.0)  # decode: 1 unit
    budget = ExpectedThroughputBudget(profile)
    conf = [np.full(15, 0.5)]  # 1 + 7.5 tokens at N = 16 for 2 units: pays on paper
    assert not budget.choose(1, conf, 0.0).autoregressive
    assert budget.lambda_verify == 1.0 and budget.lambda_decode == 1.0
    for _ in range(40):  # every speculative step actually takes 3x its profiled time
        budget.observe_time(1, 16, 3.0 * profile.verify_time(1, 16))
    assert abs(budget.lambda_verify - 3.0) < 1e-6
    slow = budget.best(1, conf, 1.0)
    assert abs(slow.predicted_seconds - 3.0 * profile.verify_time(1, slow.nodes)) < 1e-9
    budget.backoff, budget.skip_remaining = 1, 0
    assert budget.choose(1, [np.full(15, 0.3)], 0.0).autoregressive  # 1 + 4.5 tokens in 6 units < 1 token a unit
    for _ in range(40):  # decode steps are slow too: speculation pays again
        budget.observe_time(1, 0, 4.0 * profile.decode_time(1))
    assert abs(budget.lambda_decode - 4.0) < 1e-6
    assert not budget.choose(1, [np.full(15, 0.3)], 0.0).autoregressive
    budget.observe_time(1, 1024, 1.0)  # outside the profiled buckets: ignored
    budget.observe_time(1, 16, float("nan"))
    assert abs(budget.lambda_verify - 3.0) < 1e-6


def test_budget_backs_off_when_drafting_costs_more_than_it_gains():
    profile = flat_profile(verify=lambda b, n: 1.0 + n / 64.0)
    budget = ExpectedThroughputBudget(profile)
    confident = [np.full(15, 0.6)]
    cheap = budget.choose(1, confident, draft_seconds=0.1)
    assert not cheap.autoregressive and budget.want_draft(1)  # drafting pays: keep drafting
    expensive = budget.choose(1, confident, draft_seconds=20.0)  # 10 tokens / (1.25 + 20) s < 1 token / s
    assert not expensive.autoregressive  # the draft is paid for: verifying it still beats decoding now
    assert "does not pay" in expensive.reason
    # then decode without drafting until the wasted draft is 2 % of the time (the default probe_cost_fraction):
    # 20 / (0.02 * 1) = 1000 steps
    assert [budget.want_draft(1) for _ in range(1001)] == [False] * 1000 + [True]


def test_engine_falls_back_to_autoregressive_when_drafts_are_useless():
    """A drafter whose proposals are never right (but claims confidence) is switched off by calibration and backoff:
    most steps become plain decode steps."""

    target = TrigramTarget(vocab=6, num_slots=2, max_seq_len=400, scale=8.0)

    class WrongDrafter(PromptLookupDrafter):
        name = "wrong"

        def propose(self, requests, max_nodes, chain):
            out = []
            for r in requests:
                right = int(target.logits_after(torch.tensor(r.context[-2]), torch.tensor(r.context[-1])).argmax())
                wrong = [t for t in range(6) if t != right][:3]
                out.append(Draft([r.context[-1]] + wrong, [-1, 0, 0, 0], np.array([1.0, 0.9, 0.05, 0.04])))
            return out

    profile = flat_profile(verify=lambda b, n: 1.0 + n / 64.0)
    engine = Engine(target, WrongDrafter(), mode="tree", budget="expected", profile=profile)
    ar = Engine(TrigramTarget(vocab=6, num_slots=2, max_seq_len=400, scale=8.0), mode="autoregressive")
    params = SamplingParams(max_new_tokens=200)
    assert [r.tokens for r in engine.generate([[1, 2]], params)] == [r.tokens for r in ar.generate([[1, 2]], params)]
    kinds = [s.kind for s in engine.stats.steps if s.kind != "prefill"]
    assert kinds.count("autoregressive") > 0.8 * len(kinds)


def test_engine_calibrates_costs_with_each_step_but_its_draft(monkeypatch):
    """The budget's time calibration sees every decode and speculative step, timed whole but for the draft (the
    bookkeeping after the model call is host time a step costs too), with the step's node bucket (0 = decode)."""
    target = TrigramTarget(vocab=8, num_slots=2, max_seq_len=400, scale=8.0)
    profile = flat_profile(verify=lambda b, n: 1.0 + n / 64.0)
    engine = Engine(target, PromptLookupDrafter(), mode="tree", budget="expected", profile=profile)
    seen = []
    monkeypatch.setattr(engine.budget, "observe_time", lambda b, n, seconds: seen.append((b, n, seconds)))
    engine.generate(prompts_for(8, 2, seed=3), SamplingParams(max_new_tokens=40))
    steps = [s for s in engine.stats.steps if s.kind != "prefill"]
    assert len(seen) == len(steps) and any(s.kind == "verify" for s in steps)
    for (b, n, seconds), s in zip(seen, steps):
        assert (b, n) == (s.batch, 0 if s.kind == "autoregressive" else s.nodes)
        assert seconds == s.total_s - s.draft_s and seconds >= s.model_s


def test_cost_profile_round_trip_and_validation(tmp_path):
    profile = flat_profile(verify=lambda b, n: 1.0 + n / 10)
    path = tmp_path / "profile.json"
    profile.save(path)
    loaded = CostProfile.load(path)
    assert loaded.verify_s == profile.verify_s and loaded.decode_s == profile.decode_s
    assert loaded.verify_time(3, 5) == profile.verify_s[(4, 8)]
    with pytest.raises(ValueError, match="exceeds"):
        loaded.verify_time(65, 1)
    with pytest.raises(ValueError, match="verify_s"):
        CostProfile((1,), (1, 2), {1: 1.0}, {(1, 1): 1.0})


def test_measured_profile_on_the_reference(tiny_reference):
    engine = Engine(ReferenceTarget(tiny_reference, num_slots=2, max_seq_len=64), PromptLookupDrafter(),
                    mode="tree", budget="expected", max_nodes=4, node_buckets=(1, 2, 4), batch_buckets=(1, 2))
    profile = engine.profile
    assert profile is not None and set(profile.verify_s) == {(b, n) for b in (1, 2) for n in (1, 2, 4)}
    assert all(t > 0 for t in profile.verify_s.values())
    assert sorted(engine.free_slots) == [0, 1]
    out = engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4))
    assert len(out[0].tokens) == 4


# ================================================================================================== bad input
def test_bad_requests_raise_clear_errors():
    target = TrigramTarget(vocab=6, num_slots=2, max_seq_len=10)
    engine = Engine(target, PromptLookupDrafter(), mode="tree", budget="fixed", max_nodes=4)
    with pytest.raises(ValueError, match="prompt is empty"):
        engine.submit([])
    with pytest.raises(ValueError, match="context"):
        engine.submit(list(range(6)) + [0, 1, 2, 3])
    with pytest.raises(ValueError, match=r"prompt\[1\]"):
        engine.submit([1, 6])
    with pytest.raises(ValueError, match="stop_token_ids"):
        engine.submit([1], SamplingParams(stop_token_ids=(9,)))
    with pytest.raises(ValueError, match="temperature"):
        engine.submit([1], SamplingParams(temperature=-1))
    # a batch where one prompt is bad queues nothing
    with pytest.raises(ValueError, match="prompt is empty"):
        engine.generate([[1, 2], []])
    assert not engine.waiting
    with pytest.raises(ValueError, match="max_batch"):
        Engine(target, mode="autoregressive", max_batch=3)
    with pytest.raises(ValueError, match="drafter"):
        Engine(target, None, mode="tree")
    with pytest.raises(ValueError, match="mode"):
        Engine(target, PromptLookupDrafter(), mode="beam")
    with pytest.raises(ValueError, match="unknown drafter"):
        make_drafter("medusa")


def test_more_requests_than_slots_are_queued_not_failed():
    target = TrigramTarget(vocab=6, num_slots=4, max_seq_len=40)
    engine = Engine(target, PromptLookupDrafter(), mode="tree", budget="fixed", max_nodes=4, max_batch=3)
    out = engine.generate(prompts_for(6, 20, seed=9), SamplingParams(max_new_tokens=5))
    assert all(len(r.tokens) == 5 for r in out)
    assert max(s.batch for s in engine.stats.steps) == 3


def test_abort_frees_the_slot_and_leaves_the_others_unchanged(tiny_reference):
    """A running request aborted between steps frees its slot and drafter state; a waiting one never runs; the
    request that keeps running emits exactly the tokens it emits alone, and the freed slot serves a new request."""
    prompts = prompts_for(48, 3, seed=4)
    params = SamplingParams(max_new_tokens=12)

    def engine():
        return Engine(ReferenceTarget(tiny_reference, num_slots=2, max_seq_len=64), PromptLookupDrafter(),
                      mode="tree", budget="fixed", max_nodes=4)

    alone = engine().generate([prompts[0]], params)[0].tokens
    eng = engine()
    keep, drop, queued = (eng.submit(p, params) for p in prompts)
    outputs = {keep: [], drop: []}
    for _ in range(2):
        for event in eng.step():
            outputs[event.request_id].extend(event.tokens)
    assert [r.request_id for r in eng.running] == [keep, drop] and [r.request_id for r in eng.waiting] == [queued]
    drop_slot = next(r.slot for r in eng.running if r.request_id == drop)
    assert eng.abort(queued) and eng.abort(drop)
    assert not eng.abort(drop) and not eng.abort(12345)
    assert eng.finished[drop].finish_reason == eng.finished[queued].finish_reason == "abort"
    assert eng.finished[queued].output == [] and len(eng.running) == 1 and drop_slot in eng.free_slots
    assert drop_slot not in eng.model.caches
    late = eng.submit(prompts[1], params)
    outputs[late] = []
    while eng.has_work():
        for event in eng.step():
            outputs[event.request_id].extend(event.tokens)
    assert outputs[keep] == alone
    assert outputs[late] == engine().generate([prompts[1]], params)[0].tokens
    assert eng.finished[late].slot == drop_slot and sorted(eng.free_slots) == [0, 1]


def test_budget_remembers_draft_costs_in_the_profile():
    """A drafter's measured cost lands in the shared profile: a new budget for the same drafter does not pay for a
    draft whose best case (every node accepted) loses to decoding, probes it once per amortization period, and
    leaves other drafters alone; the costs survive the profile's JSON round trip."""
    profile = flat_profile(verify=lambda b, n: 1.0 + n / 16.0)  # decode: 1 unit; verify at N = 16: 2 units
    first = ExpectedThroughputBudget(profile, drafter="slow")
    assert first.want_draft(1)  # cost unknown: draft
    first.record_draft_time(1, 100.0)  # at best 64 tokens for 5 + 100 units (N = 64): hopeless
    assert profile.draft_time("slow", 1) == 100.0
    later = ExpectedThroughputBudget(profile, drafter="slow", probe_cost_fraction=0.05)
    drafts = [later.want_draft(1) for _ in range(4002)]
    assert drafts[:2000] == [False] * 2000 and drafts[2000] and sum(drafts) == 2  # one probe per 100 / 0.05 steps
    assert ExpectedThroughputBudget(profile, drafter="other").want_draft(1)
    cheap = ExpectedThroughputBudget(profile, drafter="cheap")
    cheap.record_draft_time(1, 0.5)  # best case 64 / 5.5 > 1.1 tokens a unit: worth drafting
    assert all(cheap.want_draft(1) for _ in range(5))
    shallow = ExpectedThroughputBudget(profile, drafter="shallow")
    shallow.record_draft_time(1, 3.0, depth=3)  # at most 4 tokens a step: 4 / (1.25 + 3) < 1.1 at N = 4, less beyond
    assert not shallow.want_draft(1) and profile.draft_max_depth("shallow", 1) == 3
    deep = ExpectedThroughputBudget(profile, drafter="deep")
    deep.record_draft_time(1, 3.0)  # depth unknown: the whole tree may be accepted, 64 / (5 + 3) tokens a unit
    assert deep.want_draft(1)
    back = CostProfile.from_dict(json.loads(json.dumps(profile.to_dict())))
    assert back.draft_time("slow", 1) == 100.0 and back.draft_time("cheap", 1) == 0.5
    assert back.draft_max_depth("shallow", 1) == 3
    with pytest.raises(ValueError, match="margin"):
        ExpectedThroughputBudget(profile, margin=-0.1)


def test_budget_margin_declines_marginal_speculation():
    """Speculation predicted 5 % faster than decoding is declined under the default 10 % margin, taken at 0."""
    profile = flat_profile(verify=lambda b, n: 2.0)  # every tree costs 2 decode steps
    conf = [np.full(15, 1.1 / 15)]  # 1 + 1.1 tokens in 2 units: 1.05 tokens a unit against 1
    assert ExpectedThroughputBudget(profile).choose(1, conf, 0.0).autoregressive
    assert not ExpectedThroughputBudget(profile, margin=0.0).choose(1, conf, 0.0).autoregressive


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), data=st.data())
def test_draft_cut_keeps_the_most_confident_subtree(n, data):
    """``Draft.cut(nodes, max_depth)`` equals the definition: walk the nodes by descending confidence (ties to the
    lower index), keep a node when its parent is kept, it is no deeper than ``max_depth`` and fewer than ``nodes``
    are kept; renumbered in index order. Checked on best-first drafts (the fast prefix path) and on shuffled orders."""
    parents = [-1] + [data.draw(st.integers(0, i - 1)) for i in range(1, n)]
    factors = [1.0] + [data.draw(st.floats(0.05, 1.0)) for _ in range(1, n)]
    conf = np.ones(n)
    for i in range(1, n):
        conf[i] = conf[parents[i]] * factors[i]  # never increases along a path
    best_first = data.draw(st.booleans())
    if best_first:  # renumber by descending confidence (parents still precede: a child is never more confident)
        order = sorted(range(n), key=lambda i: (-conf[i], i))
        new = {old: k for k, old in enumerate(order)}
        parents = [-1] + [new[parents[old]] for old in order[1:]]
        conf = conf[order]
    draft = Draft(list(range(100, 100 + n)), parents, conf)
    nodes = data.draw(st.integers(1, n + 2))
    max_depth = data.draw(st.one_of(st.none(), st.integers(0, n)))
    depth = draft.depth()
    keep, kept = [0], {0}
    for i in sorted(range(1, n), key=lambda i: (-conf[i], i)):
        if len(keep) < nodes and parents[i] in kept and (max_depth is None or depth[i] <= max_depth):
            keep.append(i)
            kept.add(i)
    keep.sort()
    got = draft.cut(nodes, max_depth)
    assert got.tokens == [100 + i for i in keep]
    assert got.parents == [-1] + [keep.index(parents[i]) for i in keep[1:]]
    np.testing.assert_array_equal(got.confidence, conf[keep])


# ============================================================================================= reproducible sampling
@pytest.mark.parametrize("budget", ["fixed", "expected"])
def test_seeded_sampling_gives_one_text_whatever_the_trees(budget):
    """A seeded sampled request gives the same text under autoregressive decoding and under tree speculation with
    any tree sizes (the budget's choices, fixed sizes): deterministic drafts draw each token with its output
    position's coin. The expected-throughput budget picks sizes from timings, so its trees change from run to run;
    the text does not."""
    params = SamplingParams(temperature=0.8, top_k=4, seed=7, max_new_tokens=24)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]

    def text(mode: str, nodes: int) -> tuple[list[int], int]:
        drafter = SampledTableDrafter(5, "deterministic") if mode != "autoregressive" else None
        buckets = [n for n in (1, 2, 4, 8, 16, 32) if n <= nodes]
        profile = CostProfile((1, 2), buckets, {1: 1.0, 2: 1.2},  # costs that make the budget vary its sizes
                              {(b, n): 1.0 + 0.04 * n * b for b in (1, 2) for n in buckets})
        engine = Engine(TrigramTarget(vocab=5, num_slots=2, seed=4), drafter, mode=mode, profile=profile,
                        budget=budget if mode != "autoregressive" else "none", max_nodes=nodes, seed=0)
        out = engine.generate([prompt], params)[0]
        return out.tokens, sum(s.accepted for s in engine.stats.steps)

    reference, _ = text("autoregressive", 1)
    accepted = 0
    for mode, nodes in (("tree", 4), ("tree", 16), ("chain", 8), ("tree", 32)):
        tokens, acc = text(mode, nodes)
        assert tokens == reference, (mode, nodes)
        accepted += acc
    assert accepted > 0  # drafts were accepted: the speculative steps drew several positions' tokens at once


@pytest.mark.parametrize("temperature", [1e-320, 5e-324, 1e-45, 1e-30])
def test_temperatures_too_small_for_the_dtype_behave_as_greedy(temperature):
    """Logits divided by a tiny temperature overflow; the distribution must still be the argmax's point mass (never
    NaN, never the last token by default)."""
    logits = torch.tensor([[[0.5, 3.0, -1.0, 2.9]]], dtype=torch.float32)  # [B, N, V]
    for dtype in (torch.float32, torch.float64):
        probs = sampling.target_probs(logits.to(dtype), torch.tensor([temperature], dtype=torch.float64),
                                      torch.tensor([0]), torch.tensor([1.0]))
        assert torch.equal(probs[0, 0], torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=probs.dtype)), dtype
    assert sampling.sample_from(probs[:, 0], torch.tensor([0.999])).tolist() == [1]


def test_nan_never_samples():
    with pytest.raises(ValueError, match="NaN"):
        sampling.sample_from(torch.tensor([[0.5, float("nan"), 0.5]]), torch.tensor([0.3]))
    with pytest.raises(ValueError, match="NaN"):
        sampling.target_probs(torch.tensor([[[0.0, float("nan")]]]), torch.tensor([1.0]), torch.tensor([0]),
                              torch.tensor([1.0]))
