"""Tree verification: greedy rule, exact losslessness of the three sampling variants, the lossy mutant, the exact
enumerator, the drafting side, validation."""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import trees

from lumotree.reference.tree import TokenTree
from lumotree.reference.verify import (
    VARIANTS,
    DraftBuilder,
    DraftProposal,
    RandomCoins,
    autoregressive_distribution,
    check_distribution,
    draw_tree,
    enumerate_outcomes,
    residual,
    speculative_distribution,
    speculative_step,
    step_distribution,
    verify_greedy,
    verify_sampling,
    verify_sampling_lossy_unnormalised_residual,
)

F = Fraction


def all_parent_arrays(n: int) -> list[list[int]]:
    """Every valid parent array of n nodes (topological order)."""
    out = [[-1]]
    for i in range(1, n):
        out = [p + [j] for p in out for j in range(i)]
    return out


def context_table(seed: int, vocab: int, zero_mass: bool = True, order: int = 2):
    """A sequence distribution: the next-token distribution depends on the last ``order`` tokens (random Fractions)."""
    cache: dict = {}

    def dist(seq: tuple[int, ...]) -> list[Fraction]:
        key = tuple(seq[-order:])
        if key not in cache:
            rng = random.Random(f"{seed}/{key}")
            w = [rng.randint(0 if zero_mass else 1, 5) for _ in range(vocab)]
            if sum(w) == 0:
                w[rng.randrange(vocab)] = 1
            cache[key] = [F(x, sum(w)) for x in w]
        return cache[key]

    return dist


def lossless(template, variant, target, draft, context=(0,), horizon=3, verify=verify_sampling) -> bool:
    spec = speculative_distribution(context, horizon, lambda c: step_distribution(c, target, draft, template, variant,
                                                                                  verify))
    spec = {k: v for k, v in spec.items() if v != 0}
    return spec == autoregressive_distribution(context, horizon, target)


# ---------------------------------------------------------------------------------------------------- greedy
def greedy_by_definition(tree: TokenTree, target) -> tuple[list[int], int]:
    """Node-wise rule: i accepted iff its token is the argmax at its parent and the parent is accepted."""
    best = [max(range(len(row)), key=lambda t: (row[t], -t)) for row in target]
    accepted = [True] + [False] * (tree.num_nodes - 1)
    for i in range(1, tree.num_nodes):
        p = tree.parents[i]
        accepted[i] = accepted[p] and tree.tokens[i] == best[p]
    nodes = [i for i in range(tree.num_nodes) if accepted[i]]
    deepest = max(nodes, key=lambda i: tree.depth[i])
    assert nodes == tree.path(deepest)  # distinct siblings: the accepted set is one path
    return nodes, best[deepest]


@settings(max_examples=60)
@given(parents=trees(max_nodes=12), seed=st.integers(0, 2**31), vocab=st.integers(2, 5), exact=st.booleans())
def test_greedy_matches_the_nodewise_definition(parents, seed, vocab, exact):
    rng = np.random.default_rng(seed)
    n = len(parents)
    shape = TokenTree(parents)
    vocab = max([vocab] + [len(shape.children(u)) for u in range(n)])
    tokens = [int(rng.integers(vocab))] + [0] * (n - 1)
    for u in range(n):  # distinct sibling tokens
        kids = shape.children(u)
        for c, t in zip(kids, rng.choice(vocab, size=len(kids), replace=False)):
            tokens[c] = int(t)
    tree = TokenTree(parents, tokens)
    logits = rng.integers(-3, 3, (n, vocab)).astype(np.float64)  # many ties: the lowest id must win
    target = np.vectorize(F, otypes=[object])(logits.astype(int)) if exact else logits
    result = verify_greedy(tree, target)
    nodes, nxt = greedy_by_definition(tree, logits)
    assert list(result.accepted_nodes) == nodes
    assert result.next_token == nxt
    assert result.accepted_tokens == tuple(tokens[i] for i in nodes[1:])


@pytest.mark.parametrize("parents", all_parent_arrays(4) + [[-1, 0, 0, 1, 1, 2, 2]])
def test_greedy_emits_the_greedy_autoregressive_tokens(parents):
    """Every labelling of the shape over a vocabulary of 2: emitted tokens = the greedy continuation's prefix."""
    vocab = 2
    target = context_table(7, vocab)
    context = (1, 0)
    shape = TokenTree(parents)
    for labels in np.ndindex(*([vocab] * len(parents))):
        tokens = (context[-1],) + labels[1:]
        if any(tokens[i] == tokens[j] for i in range(1, len(parents)) for j in range(1, i)
               if parents[i] == parents[j]):
            continue
        tree = TokenTree(parents, tokens)
        rows = [target(context + tuple(tokens[j] for j in tree.path(i)[1:])) for i in range(len(parents))]
        emitted = verify_greedy(tree, rows).emitted
        seq = context
        for tok in emitted:
            greedy = max(range(vocab), key=lambda t: (target(seq)[t], -t))
            assert tok == greedy
            seq = seq + (tok,)
        # and it stopped exactly where the tree had no greedy child
        node = tree.path(0)[-1]
        for tok in emitted[:-1]:
            node = tree.child_with_token(node, tok)
        assert tree.child_with_token(node, emitted[-1]) is None
        assert shape.parents == tree.parents


# ---------------------------------------------------------------------------------------------------- lossless
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("parents", all_parent_arrays(1) + all_parent_arrays(2) + all_parent_arrays(3)
                         + all_parent_arrays(4))
def test_sampling_is_lossless_exactly_every_shape_up_to_4_nodes(parents, variant):
    target, draft = context_table(1, 2), context_table(2, 2)
    assert lossless(parents, variant, target, draft)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("parents", [[-1, 0, 0, 0], [-1, 0, 1, 1], [-1, 0, 0, 1]])
def test_sampling_is_lossless_exactly_vocab_3(parents, variant):
    target, draft = context_table(3, 3), context_table(4, 3)
    assert lossless(parents, variant, target, draft)


def one_hot(token: int, vocab: int):
    return lambda seq: [F(int(t == token)) for t in range(vocab)]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(
    "case", ["p_equals_q", "disjoint_supports", "one_hot_q", "one_hot_p"]
)
def test_sampling_is_lossless_on_adversarial_distributions(variant, case):
    vocab = 3
    target = context_table(5, vocab)
    if case == "p_equals_q":
        draft = target
    elif case == "disjoint_supports":
        target = lambda seq: [F(1, 2), F(1, 2), F(0)]  # noqa: E731
        draft = lambda seq: [F(0), F(0), F(1)]  # noqa: E731
    elif case == "one_hot_q":
        draft = one_hot(1, vocab)
    else:
        target, draft = one_hot(2, vocab), context_table(6, vocab)
    for parents in ([-1, 0, 0], [-1, 0, 1, 0], [-1, 0, 0, 0]):
        assert lossless(parents, variant, target, draft)


def test_sampling_is_lossless_on_sympy_numbers():
    def target(seq):
        return [sympy.Rational(1, 3), sympy.Rational(1, 6), sympy.Rational(1, 2)] if seq[-1] != 2 else \
            [sympy.Rational(1, 2), sympy.Rational(1, 4), sympy.Rational(1, 4)]

    def draft(seq):
        return [sympy.Rational(1, 5), sympy.Rational(3, 5), sympy.Rational(1, 5)]

    for variant in VARIANTS:
        assert lossless([-1, 0, 0], variant, target, draft, horizon=2)


@pytest.mark.parametrize("variant", VARIANTS)
def test_lossy_variant_is_refuted(variant):
    target, draft = context_table(1, 2), context_table(2, 2)
    lossy = verify_sampling_lossy_unnormalised_residual
    # with one draw per node the missing renormalisation is invisible ...
    assert lossless([-1, 0, 1], variant, target, draft, verify=lossy)
    # ... with siblings it is not
    target, draft = context_table(3, 3), context_table(4, 3)
    assert not lossless([-1, 0, 0, 0], variant, target, draft, verify=lossy)


def test_iid_duplicate_draws_must_each_update_the_residual():
    """Merging an i.i.d. duplicate into one visit (forgetting its second rejection) is lossy: draws matter."""
    target, draft = context_table(3, 3), context_table(4, 3)

    def merged_verify(proposal, rows, coins):
        once = DraftProposal(proposal.tree, proposal.variant, proposal.proposals, None, proposal.vocab_size)
        return verify_sampling(once, rows, coins)

    assert lossless([-1, 0, 0, 0], "iid", target, draft)
    assert not lossless([-1, 0, 0, 0], "iid", target, draft, verify=merged_verify)


def test_float_probabilities_match_exact_ones():
    target, draft = context_table(3, 3), context_table(4, 3)

    def as_float(fn):
        return lambda seq: [float(x) for x in fn(seq)]

    exact = step_distribution((0, 1), target, draft, [-1, 0, 0, 1], "iid")
    approx = step_distribution((0, 1), as_float(target), as_float(draft), [-1, 0, 0, 1], "iid")
    assert exact.keys() == approx.keys()
    assert all(abs(float(exact[k]) - approx[k]) < 1e-12 for k in exact)


def test_random_coins_sample_the_exact_distribution():
    target, draft = context_table(3, 3), context_table(4, 3)
    exact = step_distribution((0, 1), target, draft, [-1, 0, 0, 1], "without_replacement")
    n = 1500
    coins = RandomCoins(123)
    counts: dict = {}
    for _ in range(n):
        out = speculative_step((0, 1), target, draft, [-1, 0, 0, 1], "without_replacement", coins)
        counts[out] = counts.get(out, 0) + 1
    assert set(counts) <= set(exact)
    for k, p in exact.items():
        sd = (float(p) * (1 - float(p)) / n) ** 0.5
        assert abs(counts.get(k, 0) / n - float(p)) < 5 * sd + 1e-9


# ---------------------------------------------------------------------------------------------------- enumerator
def test_enumerator_exact_on_a_known_function():
    def fn(coins):
        a = coins.bernoulli(F(1, 3))
        b = coins.categorical([F(1, 2), F(0), F(1, 2)]) if a else 7
        return (a, b)

    assert enumerate_outcomes(fn) == {(True, 0): F(1, 6), (True, 2): F(1, 6), (False, 7): F(2, 3)}


def test_enumerator_sums_coinciding_outcomes_and_skips_zero_branches():
    calls = []

    def fn(coins):
        calls.append(1)
        return coins.bernoulli(F(1)) + coins.categorical([F(1, 4), F(3, 4)]) * 0

    assert enumerate_outcomes(fn) == {1: F(1)}
    assert len(calls) == 2  # p = 1 has one branch; the categorical two


def test_enumerator_rejects_bad_functions():
    with pytest.raises(RuntimeError, match="sum to"):
        enumerate_outcomes(lambda coins: coins.categorical([F(1, 2), F(1, 4)]))
    with pytest.raises(TypeError, match="hashable"):
        enumerate_outcomes(lambda coins: [coins.bernoulli(F(1, 2))])
    with pytest.raises(ValueError, match="0 <= p <= 1"):
        enumerate_outcomes(lambda coins: coins.bernoulli(F(3, 2)))
    state = {"n": 0}

    def nondeterministic(coins):
        state["n"] += 1
        return coins.categorical([F(1, 3)] * 3 if state["n"] == 1 else [F(1)])

    with pytest.raises(RuntimeError, match="not deterministic"):
        enumerate_outcomes(nondeterministic)


def test_random_coins_never_draw_impossible_outcomes():
    coins = RandomCoins(0)
    assert all(coins.bernoulli(1.0) for _ in range(50)) and not any(coins.bernoulli(0) for _ in range(50))
    draws = {coins.categorical([0.0, 0.5, 0.0, 0.5]) for _ in range(200)}
    assert draws == {1, 3}
    assert coins.categorical([F(0), F(1)]) == 1


# ---------------------------------------------------------------------------------------------------- drafting side
def test_draw_tree_exact_draft_probabilities():
    q = lambda path: [F(1, 3), F(2, 3)]  # noqa: E731
    iid = enumerate_outcomes(lambda c: draw_tree([-1, 0, 0], 5, q, "iid", c))
    by_draws = {(p.tree.tokens, p.draws): pr for p, pr in iid.items()}
    assert by_draws == {
        ((5, 0), ((1, 1), ())): F(1, 9),
        ((5, 0, 1), ((1, 2), (), ())): F(2, 9),
        ((5, 1, 0), ((1, 2), (), ())): F(2, 9),
        ((5, 1), ((1, 1), ())): F(4, 9),
    }
    wr = enumerate_outcomes(lambda c: draw_tree([-1, 0, 0, 0], 5, q, "without_replacement", c))
    assert {p.tree.tokens: pr for p, pr in wr.items()} == {(5, 0, 1): F(1, 3), (5, 1, 0): F(2, 3)}
    det = enumerate_outcomes(lambda c: draw_tree([-1, 0, 0, 1], 5, q, "deterministic", c))
    ((proposal, pr),) = det.items()
    assert pr == 1 and proposal.tree == TokenTree([-1, 0, 0, 1], [5, 1, 0, 1])


def test_draw_tree_sums_to_one_and_passes_paths_to_the_drafter():
    seen = []

    def q(path):
        seen.append(path)
        return context_table(9, 3)(path)

    dist = enumerate_outcomes(lambda c: draw_tree([-1, 0, 1, 0], 2, q, "iid", c))
    assert sum(dist.values()) == 1
    assert all(p[0] == 2 for p in seen) and {len(p) for p in seen} == {1, 2}


def test_draft_builder_refuses_a_changed_proposal_and_missing_coins():
    b = DraftBuilder(0, "iid")
    with pytest.raises(ValueError, match="coins is None"):
        b.draw(0, [0.5, 0.5], None)
    with pytest.raises(ValueError, match="not a node"):
        b.draw(3, [0.5, 0.5], RandomCoins(0))


# ---------------------------------------------------------------------------------------------------- validation
def test_check_distribution_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"probs\[1\] = -1/2 is negative"):
        check_distribution("probs", [F(3, 2), F(-1, 2)])
    with pytest.raises(ValueError, match="not exactly 1"):
        check_distribution("probs", [F(1, 2), F(1, 3)])
    with pytest.raises(ValueError, match="float tolerance"):
        check_distribution("probs", [0.5, 0.5 + 1e-6])
    assert check_distribution("probs", np.array([0.5, 0.5 + 1e-12])) == [0.5, 0.5 + 1e-12]
    with pytest.raises(TypeError, match="mixes floats"):
        check_distribution("probs", [0.5, F(1, 2)])
    with pytest.raises(ValueError, match="expected vocab_size = 3"):
        check_distribution("probs", [F(1)], 3)
    with pytest.raises(ValueError, match="not finite"):
        check_distribution("probs", [float("nan"), 1.0])
    with pytest.raises(ValueError, match="1-D"):
        check_distribution("probs", np.ones((2, 2)) / 4)
    with pytest.raises(ValueError, match="compared"):
        check_distribution("probs", [sympy.Symbol("x"), 1 - sympy.Symbol("x")])


def test_draft_proposal_validation():
    tree = TokenTree([-1, 0, 0], [0, 1, 2])
    q = (F(1, 3), F(1, 3), F(1, 3))
    with pytest.raises(ValueError, match="must carry tokens"):
        DraftProposal(TokenTree([-1, 0]), "iid")
    with pytest.raises(ValueError, match="variant"):
        DraftProposal(tree, "top_p")
    with pytest.raises(ValueError, match=r"proposals\[0\] is missing"):
        DraftProposal(tree, "iid", (None, None, None))
    with pytest.raises(ValueError, match="probability 0"):
        DraftProposal(tree, "iid", ((F(1, 2), F(1, 2), F(0)), None, None))
    with pytest.raises(ValueError, match=r"draws\[0\]"):
        DraftProposal(tree, "iid", (q, None, None), ((1,), (), ()))
    with pytest.raises(ValueError, match="only the 'iid' variant"):
        DraftProposal(tree, "without_replacement", (q, None, None), ((1, 1, 2), (), ()))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        DraftProposal(TokenTree([-1, 0], [0, 5]), "iid", (q, None))
    ok = DraftProposal(tree, "deterministic")
    with pytest.raises(ValueError, match="target has 2 rows"):
        verify_sampling(ok, [q, q], RandomCoins(0))
    with pytest.raises(ValueError, match=r"target\[1\] sums to"):
        verify_sampling(ok, [q, (F(1), F(1), F(0)), q], RandomCoins(0))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        verify_greedy(TokenTree([-1, 0], [0, 3]), np.zeros((2, 3)))
    with pytest.raises(ValueError, match="NaN"):
        verify_greedy(TokenTree([-1, 0], [0, 1]), np.array([[0.0, np.nan], [0.0, 0.0]]))
    with pytest.raises(ValueError, match="R equals Q"):
        residual([F(1, 2), F(1, 2)], [F(1, 2), F(1, 2)])
