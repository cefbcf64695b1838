"""Mutation tests: a subtly wrong reference, substituted through the proofs' seam, makes the matching check come out
``refuted`` with a concrete counterexample (and the counterexample really shows the difference)."""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest

from lumotree.proofs import default_reference, run_check
from lumotree.reference import attention as attention_module
from lumotree.reference import gdn
from lumotree.reference import verify as verify_module
from lumotree.reference.tree import TokenTree


class SkipNearestAncestor(TokenTree):
    """Off-by-one ancestor: the mask forgets each node's parent (the nearest strict ancestor)."""

    @property
    def ancestor_mask(self):
        mask = TokenTree(self.parents).ancestor_mask.copy()
        for i, p in enumerate(self.parents):
            if p >= 0:
                mask[i, p] = False
        return mask


class ExclusiveMask(TokenTree):
    """Inclusive/exclusive swapped: a node is not its own ancestor."""

    @property
    def ancestor_mask(self):
        return TokenTree(self.parents).ancestor_mask & ~np.eye(len(self.parents), dtype=bool)


class ExclusivePath(TokenTree):
    """Inclusive/exclusive swapped in paths: ``path(i)`` stops at the parent of i."""

    def path(self, node):
        return TokenTree(self.parents).path(node)[:-1]


def with_tree(fn, tree_class, tree_arg):
    """``fn`` called with its tree argument (position ``tree_arg``) re-wrapped as ``tree_class``."""

    def mutant(*args, **kwargs):
        args = list(args)
        tree = args[tree_arg]
        args[tree_arg] = tree_class(tree.parents, tree.tokens)
        return fn(*args, **kwargs)

    return mutant


def replaced(**fields):
    return dataclasses.replace(default_reference(), **fields)


def assert_refuted(name, ref=None, **kwargs):
    result = run_check(name, ref=ref, quick=True, **kwargs)
    assert result.status == "refuted", (result.status, result.detail)
    assert not result.ok and result.counterexample, result
    return result


def fraction_inputs(example):
    return {
        name: np.vectorize(Fraction, otypes=[object])(np.array(value, dtype=object))
        if isinstance(value, list)
        else Fraction(value)
        for name, value in example["inputs"].items()
    }


# ---------------------------------------------------------------------------------------------------- closed form
REAL_PATH_DECAY = gdn.path_decay


def diagonal_dropped_path_decay(alpha, tree):
    """Output mask exclusive instead of inclusive: D_ii = 0 (a node does not see its own delta)."""
    gamma, D = REAL_PATH_DECAY(alpha, tree)
    D = D.copy()
    for i in range(len(gamma)):
        D[i, i] = 0
    return gamma, D


def one_alpha_short_path_decay(alpha, tree):
    """Off-by-one in the decay product: D_ij over path(i) \\ path(j) misses alpha_i for strict ancestors."""
    gamma, D = REAL_PATH_DECAY(alpha, tree)
    D = D.copy()
    for i, p in enumerate(tree.parents):
        if p >= 0:
            for j in tree.path(p):
                D[i, j] = D[p, j]
    return gamma, D


@pytest.fixture
def patch_path_decay(monkeypatch):
    """Install a mutant ``path_decay`` in reference/gdn.py (the closed form looks it up there at call time)."""
    return lambda mutant: monkeypatch.setattr(gdn, "path_decay", mutant)


@pytest.mark.parametrize("check", ["closed-form/sympy", "closed-form/z3", "closed-form/fractions", "chunk/sympy"])
def test_exclusive_output_mask_is_refuted(check, patch_path_decay):
    patch_path_decay(diagonal_dropped_path_decay)
    assert_refuted(check)


def test_closed_form_counterexample_is_concrete(patch_path_decay):
    patch_path_decay(diagonal_dropped_path_decay)
    result = assert_refuted("closed-form/sympy")
    example = result.counterexample
    x = fraction_inputs(example)
    tree = TokenTree(example["tree"])
    args = (x["q"], x["k"], x["v"], x["alpha"], x["beta"], x["S0"])
    o_closed, _ = gdn.tree_closed_form(*args, tree, scale=x["scale"])
    o_rec, _ = gdn.tree_recurrent(*args, tree, scale=x["scale"])
    assert (o_closed != o_rec).any()
    assert example["tree_closed_form"] != example["tree_recurrent"]


def test_decay_product_off_by_one_is_refuted(patch_path_decay):
    patch_path_decay(one_alpha_short_path_decay)
    assert_refuted("closed-form/sympy")
    assert_refuted("commit/fractions")


@pytest.mark.parametrize("check", ["closed-form/sympy", "closed-form/z3", "commit/sympy"])
def test_off_by_one_ancestor_in_the_closed_form_is_refuted(check):
    ref = replaced(tree_closed_form=with_tree(gdn.tree_closed_form, SkipNearestAncestor, 6))
    result = assert_refuted(check, ref=ref)
    assert len(result.counterexample["tree"]) >= 2


# ---------------------------------------------------------------------------------------------------- commit
def commit_without_own_term(S0, factors, tree, node):
    """Inclusive/exclusive swapped: the accepted node's own update k_a delta_a^T is left out."""
    S = gdn.commit(S0, factors, tree, node)
    group = S.shape[0] // factors.k.shape[1]
    for h in range(S.shape[0]):
        S[h] = S[h] - np.outer(factors.k[node, h // group], factors.delta[node, h])
    return S


@pytest.mark.parametrize("check", ["commit/sympy", "commit/z3", "commit/fractions"])
def test_commit_with_exclusive_path_is_refuted(check):
    assert_refuted(check, ref=replaced(commit=commit_without_own_term))


def test_commit_with_wrong_decay_ratio_is_refuted():
    def commit_gamma_not_divided(S0, factors, tree, node):
        """Uses Gamma_a everywhere instead of Gamma_a / Gamma_j."""
        ones = np.ones_like(factors.gamma)
        return gdn.commit(S0, factors._replace(gamma=ones), tree, node) * factors.gamma[node][:, None, None]

    result = assert_refuted("commit/sympy", ref=replaced(commit=commit_gamma_not_divided))
    assert result.counterexample["entry"].startswith("S@")


# ---------------------------------------------------------------------------------------------------- chain = chunk
def test_chain_with_shifted_decay_is_refuted():
    def chain_decay_one_token_late(q, k, v, alpha, beta, S0, scale=None):
        shifted = np.concatenate([np.ones_like(alpha[:1]), alpha[:-1]], axis=0)  # [N, HV]
        return gdn.chain(q, k, v, shifted, beta, S0, scale=scale)

    result = assert_refuted("chunk/sympy", ref=replaced(chain=chain_decay_one_token_late))
    assert "chunk_size" in result.counterexample


# ---------------------------------------------------------------------------------------------------- nilpotent
def test_depth_off_by_one_breaks_the_nilpotent_solve():
    result = assert_refuted("nilpotent/sympy", ref=replaced(max_depth=lambda t: t.max_depth - 1))
    example = result.counterexample
    assert example["depth_used"] == TokenTree(example["tree"]).max_depth - 1


def test_causal_mask_instead_of_ancestor_mask_breaks_the_depth_bound():
    causal = lambda t: np.tril(np.ones((t.num_nodes, t.num_nodes), dtype=bool))  # noqa: E731
    result = assert_refuted("nilpotent/sympy", ref=replaced(ancestor_mask=causal))
    assert result.counterexample["identity"] in ("A^(depth+1)", "(I+A) series", "series (I+A)", "doubling product")


def test_descendant_mask_passes_the_series_but_breaks_the_inverse_by_halves():
    """Transposed mask (descendants in place of ancestors): A stays nilpotent of the same depth, so the series and the
    doubling product still invert I + A, but A is upper triangular and the kernels' lower block split is wrong."""
    descendants = lambda t: TokenTree(t.parents).ancestor_mask.T  # noqa: E731
    result = assert_refuted("nilpotent/sympy", ref=replaced(ancestor_mask=descendants))
    assert result.counterexample["identity"].startswith("halves at ")


# ---------------------------------------------------------------------------------------------------- index safety
def ancestor_row_bit_off_by_one(parent_row, node, word_bits=32):
    row = parent_row.copy()
    row[node // word_bits] |= 1 << ((node + 1) % word_bits)
    return row


def ancestor_row_without_modulo(parent_row, node, word_bits=32):
    """Forgets ``% word_bits``: shifts by 32 or more for nodes past the first word."""
    row = parent_row.copy()
    row[node // word_bits] |= 1 << node
    return row


def ancestor_row_exclusive(parent_row, node, word_bits=32):
    return parent_row.copy()


def mask_bit_wrong_word(words, i, j, word_bits=32):
    return (words[i][j // word_bits + 1] >> (j % word_bits)) & 1


@pytest.mark.parametrize(
    "fields",
    [
        {"ancestor_row": ancestor_row_bit_off_by_one},
        {"ancestor_row": ancestor_row_without_modulo},
        {"ancestor_row": ancestor_row_exclusive},
        {"mask_bit": mask_bit_wrong_word},
    ],
)
def test_wrong_word_arithmetic_is_refuted(fields):
    result = assert_refuted("index/ancestor-words", ref=replaced(**fields))
    assert "N" in result.counterexample and "claim" in result.counterexample


def test_a_depth_that_counts_from_one_is_refuted():
    result = assert_refuted("index/positions", ref=replaced(depth=lambda t: t.depth + 1))
    assert result.counterexample["tree"] == [-1]


# ---------------------------------------------------------------------------------------------------- conv, attention
def layer_with(**functions):
    return SimpleNamespace(**{**{n: getattr(gdn, n) for n in ("short_conv", "conv_state_commit")}, **functions})


def attention_with(**functions):
    names = ("tree_attention_core", "kv_commit")
    return SimpleNamespace(**{**{n: getattr(attention_module, n) for n in names}, **functions})


def test_conv_window_in_index_order_instead_of_ancestors_is_refuted():
    def conv_over_index_order(inputs, conv_state, weight, tree):
        return gdn.short_conv(inputs, conv_state, weight, TokenTree.chain(tree.num_nodes))

    result = assert_refuted("conv/sympy", ref=replaced(layer=layer_with(short_conv=conv_over_index_order)))
    assert result.counterexample["which"].startswith("short_conv")


def test_conv_window_off_by_one_is_refuted(monkeypatch):
    real = gdn.conv_window_index

    def window_ending_at_parent(tree, kernel):
        index = real(tree, kernel)
        shifted = index.copy()
        shifted[:, 1:] = index[:, :-1]  # drops node i itself, one more ancestor instead
        return shifted

    monkeypatch.setattr(gdn, "conv_window_index", window_ending_at_parent)
    assert_refuted("conv/sympy", ref=replaced(layer=layer_with()))


def test_conv_state_commit_of_the_parent_is_refuted():
    def commit_parent_window(inputs, conv_state, tree, node):
        parent = max(tree.parents[node], 0)
        return gdn.conv_state_commit(inputs, conv_state, tree, parent)

    result = assert_refuted("conv/sympy", ref=replaced(layer=layer_with(conv_state_commit=commit_parent_window)))
    assert result.counterexample["which"].startswith("conv_state_commit")


def test_attention_with_exclusive_mask_is_refuted():
    core = with_tree(attention_module.tree_attention_core, ExclusiveMask, 5)
    result = assert_refuted("attention/sympy", ref=replaced(attention=attention_with(tree_attention_core=core)))
    example = result.counterexample
    # with an empty cache the root attends to nothing: the mutant divides by zero where decoding is defined
    if "error" in example:
        assert example["tree"] == [-1] and example["cache_length"] == 0
    else:
        assert example["reference"] != pytest.approx(example["sequential"])


def test_attention_with_off_by_one_ancestor_is_refuted():
    core = with_tree(attention_module.tree_attention_core, SkipNearestAncestor, 5)
    assert_refuted("attention/sympy", ref=replaced(attention=attention_with(tree_attention_core=core)))


def test_kv_commit_without_the_accepted_node_is_refuted():
    kv = with_tree(attention_module.kv_commit, ExclusivePath, 4)
    result = assert_refuted("attention/sympy", ref=replaced(attention=attention_with(kv_commit=kv)))
    assert "kv_commit" in result.detail


# ---------------------------------------------------------------------------------------------------- verification
def verify_with(**functions):
    return SimpleNamespace(**{**vars(verify_module), **functions})


def test_missing_residual_renormalisation_is_refuted_and_the_lossy_check_expects_it():
    lossy = verify_module.verify_sampling_lossy_unnormalised_residual
    result = assert_refuted("lossless/iid", ref=replaced(verify=verify_with(verify_sampling=lossy)))
    example = result.counterexample
    assert Fraction(example["speculative"]) != Fraction(example["autoregressive"])
    registered = run_check("lossless/lossy-residual", quick=True)
    assert registered.status == "refuted" and registered.ok


def test_without_replacement_verified_as_iid_is_refuted():
    """Forgets to remove tried tokens from Q (the drafter did): accepts with the wrong proposal."""

    def verify_ignoring_removal(proposal, target, coins):
        as_iid = dataclasses.replace(proposal, variant="iid")
        return verify_module.verify_sampling(as_iid, target, coins)

    ref = replaced(verify=verify_with(verify_sampling=verify_ignoring_removal))
    assert_refuted("lossless/without-replacement", ref=ref)


def test_top_k_verified_with_the_drafter_q_is_refuted():
    """Treats deterministic (top-k) children as if sampled from the drafter's Q."""

    def verify_top_k_as_sampled(proposal, target, coins):
        tree = proposal.tree
        n = tree.num_nodes
        uniform = tuple(Fraction(1, len(target[0])) for _ in target[0])
        proposals = tuple(uniform if tree.children(u) else None for u in range(n))
        as_iid = dataclasses.replace(proposal, variant="iid", proposals=proposals)
        return verify_module.verify_sampling(as_iid, target, coins)

    ref = replaced(verify=verify_with(verify_sampling=verify_top_k_as_sampled))
    assert_refuted("lossless/top-k", ref=ref)


def test_greedy_with_ties_to_the_highest_id_is_refuted():
    def greedy_highest_tie(tree, target):
        flipped = [list(row)[::-1] for row in target]
        vocab = len(flipped[0])
        mirrored = TokenTree(tree.parents, [vocab - 1 - t for t in tree.tokens])
        result = verify_module.verify_greedy(mirrored, flipped)
        return dataclasses.replace(
            result,
            accepted_tokens=tuple(vocab - 1 - t for t in result.accepted_tokens),
            next_token=vocab - 1 - result.next_token,
        )

    result = assert_refuted("greedy/exhaustive", ref=replaced(verify=verify_with(verify_greedy=greedy_highest_tie)))
    assert result.counterexample["emitted"] != result.counterexample["greedy_autoregressive"]


def test_greedy_stopping_one_node_early_is_refuted():
    def greedy_one_short(tree, target):
        result = verify_module.verify_greedy(tree, target)
        if len(result.accepted_nodes) < 2:
            return result
        nodes = result.accepted_nodes[:-1]
        return dataclasses.replace(
            result, accepted_nodes=nodes, accepted_tokens=result.accepted_tokens[:-1],
            next_token=result.accepted_tokens[-1],
        )

    assert_refuted("greedy/exhaustive", ref=replaced(verify=verify_with(verify_greedy=greedy_one_short)))
