"""Greedy acceptance in one launch (``ops.greedy.tree_greedy_accept``, Triton interpreter) against the torch
reference on the dense ancestor matrix and against a brute-force walk of each tree, on random batches of every tree
shape (single node, chain, star, deep + wide, random; trees past one 32-bit word), padded nodes included."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import trees

from lumotree.optimized.ops.checks import node_mask
from lumotree.optimized.ops.greedy import greedy_accept_ref, tree_greedy_accept
from lumotree.optimized.ops.tree_meta import WORD_BITS, tree_metadata


def brute_force(parents: list[int], tokens: list[int], argmax: list[int]) -> tuple[int, int, int, list[int]]:
    """(accepted node, depth, next token, path) by walking each node's ancestors."""
    def path(i: int) -> list[int]:
        out = [i]
        while parents[out[-1]] >= 0:
            out.append(parents[out[-1]])
        return out[::-1]

    def matches(i: int) -> bool:
        return i == 0 or tokens[i] == argmax[parents[i]]

    accepted = [i for i in range(len(parents)) if all(matches(j) for j in path(i))]
    best = max(accepted, key=lambda i: (len(path(i)), -i))
    return best, len(path(best)) - 1, argmax[best], path(best)


@settings(max_examples=40, deadline=None)
@given(st.lists(trees(max_nodes=40), min_size=1, max_size=3), st.integers(0, 3), st.integers(1, 3), st.data())
def test_one_launch_equals_the_reference_and_a_brute_force_walk(batch, padding, vocab, data):
    B, N = len(batch), max(len(p) for p in batch) + padding
    parents = torch.zeros((B, N), dtype=torch.int32)  # padding nodes: parent 0 (never read)
    for b, p in enumerate(batch):
        parents[b, : len(p)] = torch.tensor(p, dtype=torch.int32)
    num_nodes = torch.tensor([len(p) for p in batch], dtype=torch.int32)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    tokens = torch.from_numpy(rng.integers(0, vocab, (B, N)))  # few ids: many matches, duplicate siblings
    argmax = torch.from_numpy(rng.integers(0, vocab, (B, N)))
    meta = tree_metadata(parents, num_nodes=num_nodes)
    got = tree_greedy_accept(tokens, argmax, parents=parents, num_nodes=num_nodes, meta=meta)
    node = torch.arange(N)
    ancestor = ((meta.words[:, :, node // WORD_BITS] >> (node % WORD_BITS)) & 1).bool()  # [B, N, N]
    best, depth, nxt, on_path = greedy_accept_ref(tokens, parents, node_mask(num_nodes, N), ancestor, meta.depth,
                                                  argmax)
    want = torch.cat([best[:, None], depth[:, None].long(), nxt[:, None], on_path.long()], 1)
    assert torch.equal(got.packed, want)
    assert torch.equal(got.accepted, best.to(torch.int32)) and torch.equal(got.advance, depth + 1)
    for b, p in enumerate(batch):
        a, d, t, path = brute_force(p, tokens[b].tolist(), argmax[b].tolist())
        assert got.packed[b, :3].tolist() == [a, d, t]
        assert torch.nonzero(got.packed[b, 3:]).flatten().tolist() == path


@pytest.mark.parametrize("wrong", [30, 31, 32, 33])
def test_a_chain_stops_at_its_first_mismatch_across_word_boundaries(wrong):
    """A 40-node chain whose every token is right but node ``wrong``'s (around bit 31, the sign bit of the first
    word, and the second word): the accepted node is the one before it."""
    N = 40
    parents = (torch.arange(N, dtype=torch.int32) - 1)[None]
    argmax = torch.arange(N, dtype=torch.int64)[None] + 1  # the target continues 1, 2, 3, ..
    tokens = torch.arange(N, dtype=torch.int64)[None]  # node i carries i: right after node i - 1
    tokens[0, wrong] = 0
    got = tree_greedy_accept(tokens, argmax, parents=parents, num_nodes=torch.tensor([N], dtype=torch.int32),
                             meta=tree_metadata(parents))
    assert got.packed[0, :3].tolist() == [wrong - 1, wrong - 1, wrong]
    assert got.packed[0, 3:].tolist() == [1] * wrong + [0] * (N - wrong) and got.advance.tolist() == [wrong]


def test_bad_arguments_are_refused_in_one_line():
    parents = torch.tensor([[-1, 0, 0]], dtype=torch.int32)
    meta = tree_metadata(parents)
    tokens = torch.zeros((1, 3), dtype=torch.int64)
    num_nodes = torch.tensor([3], dtype=torch.int32)
    with pytest.raises(TypeError, match="parents has dtype"):
        tree_greedy_accept(tokens, tokens, parents=parents.long(), num_nodes=num_nodes, meta=meta)
    with pytest.raises(ValueError, match="target_argmax has shape"):
        tree_greedy_accept(tokens, tokens[:, :2], parents=parents, num_nodes=num_nodes, meta=meta)
    with pytest.raises(ValueError, match="num_nodes\\[0\\] = 4"):
        tree_greedy_accept(tokens, tokens, parents=parents, num_nodes=num_nodes + 1, meta=meta)
    with pytest.raises(TypeError, match="meta must be a TreeMeta"):
        tree_greedy_accept(tokens, tokens, parents=parents, num_nodes=num_nodes, meta=None)
