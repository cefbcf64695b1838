"""Batched GPU-style tree verification (lumotree.optimized.engine.sampling) against the exact reference.

- target distributions (temperature, top-k, top-p) against transformers' logits warpers;
- greedy and the three sampling variants, sample by sample, against ``lumotree.reference.verify`` fed the same coins;
- the emitted distribution against the reference's exact enumeration (chi-square), and a lossy verifier failing it;
- bad sampling parameters raise naming the argument.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import build_tree_parents, chi_square_pvalue, trees

from lumotree.optimized.engine import sampling
from lumotree.optimized.engine.sampling import (
    SamplingParams,
    TreeBatch,
    VerifyOutcome,
    counter_uniforms,
    target_probs,
    verify_batch,
    verify_greedy,
    verify_sampling,
)
from lumotree.reference import verify as ref
from lumotree.reference.tree import TokenTree


def distinct_sibling_tokens(parents: list[int], vocab: int, rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """Random tokens with distinct siblings; nodes that cannot get a distinct token are cut (with their subtrees)."""
    tokens = [int(rng.integers(vocab))]
    kept_parents = [-1]
    index_of = {0: 0}
    for i in range(1, len(parents)):
        if parents[i] not in index_of:
            continue
        p = index_of[parents[i]]
        used = {tokens[j] for j in range(1, len(tokens)) if kept_parents[j] == p}
        free = [t for t in range(vocab) if t not in used]
        if not free:
            continue
        index_of[i] = len(tokens)
        kept_parents.append(p)
        tokens.append(int(rng.choice(free)))
    return tokens, kept_parents


class WalkOrderCoins:
    """Reference coins that read our coin table: the bernoulli of draw d uses ``coins[1 + d]`` and the final
    categorical uses ``coins[0]`` (inverse CDF). Draw d is tracked by following the tree: after an accepted draw the
    walk is at that child's first draw, after a rejected one at the next draw of the same node."""

    def __init__(self, draw_lists: list[list[int]], coins: np.ndarray):
        self.draw_lists = draw_lists
        self.offsets = np.cumsum([0] + [len(d) for d in draw_lists])
        self.coins = coins
        self.node, self.position = 0, 0

    def bernoulli(self, p: float) -> bool:
        d = int(self.offsets[self.node]) + self.position
        accepted = bool(self.coins[1 + d] * 1.0 < p)
        if accepted:
            self.node, self.position = self.draw_lists[self.node][self.position], 0
        else:
            self.position += 1
        return accepted

    def categorical(self, probs) -> int:
        cdf = np.cumsum(np.asarray(probs, dtype=np.float64))
        return int(min(np.searchsorted(cdf, self.coins[0] * cdf[-1], side="right"), len(cdf) - 1))


def random_case(seed: int, parents: list[int], vocab: int, variant: str):
    rng = np.random.default_rng(seed)
    tokens, parents = distinct_sibling_tokens(parents, vocab, rng)
    n = len(tokens)
    P = rng.dirichlet(np.full(vocab, 0.7), size=n)  # [N, V]
    Q = rng.dirichlet(np.full(vocab, 0.7), size=n)  # [N, V]
    kids = [[c for c in range(1, n) if parents[c] == u] for u in range(n)]
    draws = [list(k) for k in kids]
    if variant == "iid":  # draw a child twice sometimes (the reference visits it once per draw)
        for u in range(n):
            if kids[u] and rng.random() < 0.5:
                draws[u].insert(int(rng.integers(len(draws[u]) + 1)), int(rng.choice(kids[u])))
    for u in range(n):  # drawn tokens must have positive proposal mass
        for c in kids[u]:
            Q[u, tokens[c]] = max(Q[u, tokens[c]], 0.05)
        Q[u] /= Q[u].sum()
    return tokens, parents, P, Q, draws


@settings(max_examples=40)
@given(parents=trees(max_nodes=10), seed=st.integers(0, 2**31), variant=st.sampled_from(ref.VARIANTS))
def test_sampling_matches_reference_coin_for_coin(parents, seed, variant):
    vocab = 5
    tokens, parents, P, Q, draws = random_case(seed, parents, vocab, variant)
    proposal = ref.DraftProposal(
        TokenTree(parents, tokens), variant, proposals=[tuple(q) for q in Q], draws=tuple(tuple(d) for d in draws)
    )
    batch = TreeBatch.pack([tokens], [parents], draws=[draws])
    rng = np.random.default_rng(seed + 1)
    for _ in range(8):
        coins = rng.random(batch.num_coins)
        expected = ref.verify_sampling(proposal, P, WalkOrderCoins(draws, coins))
        got = verify_sampling(
            batch, torch.tensor(P)[None], torch.tensor(coins)[None], variant, torch.tensor(Q)[None]
        )
        assert got.emitted(batch)[0] == list(expected.emitted)
        assert int(got.accepted_node[0]) == expected.last_node
        assert int(got.accepted_len[0]) == expected.accepted_length


def test_batched_padded_trees_equal_one_by_one():
    rng = np.random.default_rng(3)
    vocab = 6
    cases = []
    for b in range(40):
        kind = ("single", "chain", "star", "deep_wide", "random")[b % 5]
        parents = build_tree_parents(kind, int(rng.integers(1, 12)), rng)
        cases.append(random_case(int(rng.integers(2**31)), parents, vocab, "without_replacement"))
    batch = TreeBatch.pack([c[0] for c in cases], [c[1] for c in cases])
    N = batch.width
    P = torch.zeros(len(cases), N, vocab, dtype=torch.float64)
    Q = torch.zeros_like(P)
    for b, (_, _, p, q, _) in enumerate(cases):
        P[b, : len(p)] = torch.tensor(p)
        Q[b, : len(q)] = torch.tensor(q)
        P[b, len(p) :] = float("nan")  # padding must never be read
    coins = torch.tensor(rng.random((len(cases), N)))
    for variant in ("without_replacement", "deterministic"):
        together = verify_sampling(batch, P, coins, variant, Q).emitted(batch)
        for b, (tokens, parents, p, q, _) in enumerate(cases):
            single = TreeBatch.pack([tokens], [parents])
            alone = verify_sampling(
                single, P[b : b + 1, : len(tokens)], coins[b : b + 1, : len(tokens)], variant, Q[b : b + 1, : len(q)]
            )
            assert alone.emitted(single)[0] == together[b]


@settings(max_examples=40)
@given(parents=trees(max_nodes=14), seed=st.integers(0, 2**31))
def test_greedy_matches_reference(parents, seed):
    rng = np.random.default_rng(seed)
    vocab = 4
    tokens, parents = distinct_sibling_tokens(parents, vocab, rng)
    logits = rng.standard_normal((len(tokens), vocab))
    # make drafted tokens often right: copy the parent's argmax into a child now and then
    for c in range(1, len(tokens)):
        if rng.random() < 0.6:
            want = int(np.argmax(logits[parents[c]]))
            if all(tokens[s] != want for s in range(1, len(tokens)) if parents[s] == parents[c] and s != c):
                tokens[c] = want
    expected = ref.verify_greedy(TokenTree(parents, tokens), logits)
    batch = TreeBatch.pack([tokens], [parents], width=len(tokens) + 3)  # padded
    padded = torch.full((1, batch.width, vocab), float("nan"), dtype=torch.float64)
    padded[0, : len(tokens)] = torch.tensor(logits)
    got = verify_greedy(batch, torch.nan_to_num(padded, nan=0.0).argmax(-1))
    assert got.emitted(batch)[0] == list(expected.emitted)
    # the sampling walk with a point-mass target is greedy verification
    temperature = torch.zeros(1)
    walked = verify_sampling(
        batch,
        target_probs(torch.nan_to_num(padded, nan=0.0), temperature, torch.zeros(1, dtype=torch.long), torch.ones(1)),
        torch.rand(1, batch.num_coins, dtype=torch.float64),
        "deterministic",
    )
    assert walked.emitted(batch)[0] == list(expected.emitted)


def test_target_probs_match_transformers_warpers():
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    torch.manual_seed(0)
    V = 50
    logits = torch.randn(4, 3, V, dtype=torch.float64) * 3
    logits[1, 0, :5] = logits[1, 0, 5]  # ties at the top-k boundary
    settings_ = [(0.7, 5, 1.0), (1.3, 0, 0.8), (1.0, 7, 0.5), (0.9, 0, 1.0)]
    got = target_probs(
        logits,
        torch.tensor([s[0] for s in settings_], dtype=torch.float64),
        torch.tensor([s[1] for s in settings_]),
        torch.tensor([s[2] for s in settings_], dtype=torch.float64),
    )
    for b, (t, k, p) in enumerate(settings_):
        x = TemperatureLogitsWarper(t)(None, logits[b].clone())
        if k:
            x = TopKLogitsWarper(k)(None, x)
        if p < 1:
            x = TopPLogitsWarper(p)(None, x)
        torch.testing.assert_close(got[b], torch.softmax(x, -1), rtol=1e-12, atol=1e-14)
    greedy = target_probs(logits, torch.zeros(4, dtype=torch.float64), torch.zeros(4, dtype=torch.long), torch.ones(4))
    assert torch.equal(greedy.argmax(-1), logits.argmax(-1)) and torch.all(greedy.max(-1).values == 1)


def _exact_reference_distribution(tokens, parents, P, Q, draws, variant, verifier):
    proposal = ref.DraftProposal(
        TokenTree(parents, tokens), variant, proposals=[tuple(q) for q in Q], draws=tuple(tuple(d) for d in draws)
    )
    return ref.enumerate_outcomes(lambda coins: verifier(proposal, P, coins).emitted)


def _empirical(tokens, parents, P, Q, draws, variant, copies: int, seed: int) -> dict[tuple[int, ...], int]:
    one = TreeBatch.pack([tokens], [parents], draws=[draws])
    batch = TreeBatch(one.tokens.expand(copies, -1), one.parents.expand(copies, -1), one.num_nodes.expand(copies))
    batch.first_draw, batch.draw_child, batch.draw_next = (
        t.expand(copies, -1) for t in (one.first_draw, one.draw_child, one.draw_next)
    )
    coins = counter_uniforms(torch.full((copies,), seed), torch.arange(copies), batch.num_coins)
    out = verify_sampling(
        batch,
        torch.tensor(P)[None].expand(copies, -1, -1),
        coins,
        variant,
        torch.tensor(Q)[None].expand(copies, -1, -1),
    )
    tree = TokenTree(parents, tokens)
    pairs, pair_counts = torch.unique(torch.stack([out.accepted_node, out.next_token], 1), dim=0, return_counts=True)
    counts: dict[tuple[int, ...], int] = {}
    for (node, nxt), n in zip(pairs.tolist(), pair_counts.tolist()):
        counts[tuple(tokens[i] for i in tree.path(node)[1:]) + (nxt,)] = n
    return counts


# a star with three draws at the root and a grandchild: every rejection path is exercised
LOSSY_CASE_PARENTS = [-1, 0, 0, 0, 1]


@pytest.mark.parametrize("variant", ref.VARIANTS)
def test_emitted_distribution_chi_square_and_lossy_fails(variant, monkeypatch):
    vocab = 4
    rng = np.random.default_rng(11)
    tokens = [0, 1, 2, 3, 2]
    P = rng.dirichlet(np.full(vocab, 1.0), size=5)
    P[0] = [0.25, 0.25, 0.25, 0.25]  # after rejecting token 1 the residual's normalisation decides token 2
    Q = rng.dirichlet(np.full(vocab, 1.0), size=5)
    Q[0] = [0.1, 0.5, 0.2, 0.2]
    draws = [[1, 2, 3], [4], [], [], []]
    exact = _exact_reference_distribution(tokens, LOSSY_CASE_PARENTS, P, Q, draws, variant, ref.verify_sampling)
    keys = sorted(exact)
    copies = 40000
    counts = _empirical(tokens, LOSSY_CASE_PARENTS, P, Q, draws, variant, copies, seed=5)
    assert set(counts) <= set(keys)
    observed = np.array([counts.get(k, 0) for k in keys], dtype=np.float64)
    expected = np.array([float(exact[k]) for k in keys])
    assert chi_square_pvalue(observed, expected) > 1e-3

    # the same test catches a verifier that forgets to renormalise the residual
    def lossy(residual, proposal):
        r = (residual - proposal).clamp(min=0)
        return torch.where(r.sum(-1, keepdim=True) > 0, r, residual)

    monkeypatch.setattr(sampling, "residual_after_rejection", lossy)
    lossy_counts = _empirical(tokens, LOSSY_CASE_PARENTS, P, Q, draws, variant, copies, seed=5)
    lossy_observed = np.array([lossy_counts.get(k, 0) for k in keys], dtype=np.float64)
    assert chi_square_pvalue(lossy_observed, expected) < 1e-6


def test_counter_uniforms_are_uniform_and_batch_independent():
    seeds = torch.tensor([7, 7, 123456789012345])
    counters = torch.tensor([0, 1, 0])
    u = counter_uniforms(seeds, counters, 50000)
    assert u.min() >= 0 and u.max() < 1
    hist = torch.histc(u.float(), bins=20, min=0, max=1).numpy()
    for row in range(3):
        hist = np.histogram(u[row].numpy(), bins=20, range=(0, 1))[0]
        assert chi_square_pvalue(hist.astype(np.float64), np.full(20, 1 / 20)) > 1e-4
    assert not torch.equal(u[0], u[1])
    # a row depends only on its own (seed, counter)
    alone = counter_uniforms(seeds[1:2], counters[1:2], 50000)
    assert torch.equal(alone[0], u[1])
    assert abs(float(np.corrcoef(u[0].numpy(), u[1].numpy())[0, 1])) < 0.02


def test_verify_batch_mixed_greedy_and_sampled_rows():
    torch.manual_seed(1)
    V = 8
    logits = torch.randn(2, 3, V, dtype=torch.float64)
    am = logits.argmax(-1)
    tokens = [[0, int(am[0, 0]), int(am[0, 1])], [0, int(am[1, 0]), int(am[1, 1])]]
    batch = TreeBatch.pack(tokens, [[-1, 0, 1], [-1, 0, 1]])
    out = verify_batch(
        batch,
        logits,
        torch.tensor([0.0, 1.0], dtype=torch.float64),
        torch.zeros(2, dtype=torch.long),
        torch.ones(2, dtype=torch.float64),
        torch.rand(2, 3, dtype=torch.float64),
        "deterministic",
    )
    assert out.emitted(batch)[0] == tokens[0][1:] + [int(am[0, 2])]  # greedy row: whole chain + argmax
    with pytest.raises(ValueError, match="coins"):
        verify_batch(batch, logits, torch.tensor([0.0, 1.0]), torch.zeros(2, dtype=torch.long), torch.ones(2), None)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"seed": -3}, "seed"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"stop_token_ids": (3, -1)}, "stop_token_ids"),
    ],
)
def test_invalid_sampling_params(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kwargs)


def test_malformed_trees_and_shapes_rejected():
    with pytest.raises(ValueError, match="parents"):
        TreeBatch.pack([[1, 2]], [[-1, 1]])
    batch = TreeBatch.pack([[1, 2]], [[-1, 0]])
    with pytest.raises(ValueError, match="coins"):
        verify_sampling(batch, torch.rand(1, 2, 4), torch.rand(1, 5), "deterministic")
    with pytest.raises(ValueError, match="variant"):
        verify_sampling(batch, torch.rand(1, 2, 4), torch.rand(1, 2), "lossy")
    with pytest.raises(ValueError, match="proposal"):
        verify_sampling(batch, torch.rand(1, 2, 4), torch.rand(1, 2), "iid")


def test_tree_batch_moves_in_one_piece_with_lazy_draws():
    """TreeBatch.to keeps every tensor's values, shape and dtype (one packed copy per dtype); the structure (depth,
    ancestor, valid) is built by ``to`` or on first read, the default draw lists on first read, the same whether read
    before or after the move; VerifyOutcome.to and its packed form likewise."""
    rng = np.random.default_rng(8)
    parents = [build_tree_parents(kind, 9, rng) for kind in ("single", "chain", "star", "deep_wide")]
    tokens = [distinct_sibling_tokens(p, 50, rng) for p in parents]
    batch = TreeBatch.pack([t for t, _ in tokens], [p for _, p in tokens])
    assert "first_draw" not in vars(batch) and "ancestor" not in vars(batch)  # not built yet
    fresh = TreeBatch.pack([t for t, _ in tokens], [p for _, p in tokens])
    expected = {name: getattr(fresh, name).clone() for name in ("first_draw", "draw_child", "draw_next")}
    target = torch.device("meta")  # another device; the copy's bytes are checked through sampling.moved_together
    moved = batch.to(target)
    assert "ancestor" in vars(batch) and "ancestor" in vars(moved)  # built by `to`, moved in its pack
    assert moved.tokens.device == target and moved.ancestor.dtype == torch.bool
    assert moved.first_draw.shape == expected["first_draw"].shape  # built lazily from the host arrays
    fresh.ancestor  # noqa: B018  (builds the structure: every derived tensor goes through the packed copy below)
    tensors = {k: v for k, v in vars(fresh).items() if isinstance(v, torch.Tensor)}
    assert {"depth", "ancestor", "valid", "first_draw"} <= set(tensors)
    for name, t in sampling.moved_together(tensors, torch.device("cpu")).items():
        assert t.dtype == tensors[name].dtype and torch.equal(t, tensors[name]), name
    for name, t in expected.items():
        assert torch.equal(getattr(batch, name), t), name  # the lazy build equals the eager one
    logits = torch.randn(batch.batch_size, batch.width, 50, dtype=torch.float64)
    outcome = verify_greedy(batch, logits.argmax(-1))
    on_meta = outcome.to(target)
    assert on_meta.on_path.device == target and on_meta.on_path.dtype == torch.bool
    assert on_meta.next_token.shape == outcome.next_token.shape
    unpacked = VerifyOutcome.from_packed(outcome.packed())
    for name in ("accepted_node", "accepted_len", "next_token", "on_path"):
        assert torch.equal(getattr(unpacked, name).long(), getattr(outcome, name).long()), name
