"""Confidence pruning (shared by every drafter through ``Draft.cut``): on random trees of every shape family (single
node, chain, star, deep + wide, random) the kept nodes form a valid tree, hold the N most confident paths (capped
path confidences), respect the depth limit, and ``Draft.cut`` returns exactly that tree."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lumotree.optimized.engine.drafters import Draft
from lumotree.optimized.engine.pruning import path_confidences, prune_indices
from strategies import trees


def depths(parents):
    d = [0] * len(parents)
    for i in range(1, len(parents)):
        d[i] = d[parents[i]] + 1
    return d


@st.composite
def scored_trees(draw):
    parents = draw(trees(max_nodes=24))
    n = len(parents)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["monotone", "raw", "ties"]))
    if kind == "raw":  # any numbers in [0, 1]: pruning caps them by their ancestors'
        conf = rng.uniform(0, 1, n)
    else:
        factors = rng.uniform(0.05, 1, n) if kind == "monotone" else rng.choice([0.5, 1.0], n)
        conf = np.ones(n)
        for i in range(1, n):
            conf[i] = conf[parents[i]] * factors[i]
    conf[0] = 1.0
    return parents, conf


@settings(max_examples=150)
@given(scored_trees(), st.integers(1, 30), st.one_of(st.none(), st.integers(0, 6)))
def test_pruning_keeps_the_most_confident_paths_as_a_valid_tree(tree, nodes, max_depth):
    parents, conf = tree
    keep, kept_conf = prune_indices(parents, conf, nodes, max_depth)
    capped = path_confidences(parents, conf)
    depth = depths(parents)
    # capped confidences: the running minimum along each path
    for i in range(1, len(parents)):
        assert capped[i] == min(conf[i], capped[parents[i]])
    # a valid tree: the root, ascending indices, every kept node's parent kept, no node too deep
    kept = set(keep.tolist())
    assert keep[0] == 0 and list(keep) == sorted(kept) and all(parents[i] in kept for i in keep[1:])
    assert max_depth is None or all(depth[i] <= max_depth for i in keep)
    eligible = [i for i in range(1, len(parents)) if max_depth is None or depth[i] <= max_depth]
    assert len(keep) == min(nodes, 1 + len(eligible))
    assert np.array_equal(kept_conf, capped[keep])
    # the N most confident: the kept non-root confidences are the top of the eligible ones (as multisets)
    top = sorted((capped[i] for i in eligible), reverse=True)[: len(keep) - 1]
    assert sorted(capped[keep[1:]], reverse=True) == top
    # Draft.cut (what the engine and every drafter cut with) returns this tree
    tokens = list(range(100, 100 + len(parents)))
    cut = Draft(tokens, parents, conf).cut(nodes, max_depth)
    if len(keep) < len(parents) or (max_depth is not None and max(depth) > max_depth):
        index = {old: new for new, old in enumerate(keep.tolist())}
        assert cut.tokens == [tokens[i] for i in keep]
        assert cut.parents == [-1] + [index[parents[i]] for i in keep[1:]]
        assert np.allclose(cut.confidence, kept_conf)
    else:
        assert cut.num_nodes == len(parents)


def test_pruning_rejects_bad_input():
    with pytest.raises(ValueError, match="nodes"):
        prune_indices([-1, 0], [1.0, 0.5], 0)
    with pytest.raises(ValueError, match="max_depth"):
        prune_indices([-1, 0], [1.0, 0.5], 2, -1)
    with pytest.raises(ValueError, match="parents"):
        prune_indices([-1, 2, 0], [1.0, 0.5, 0.5], 2)
    with pytest.raises(ValueError, match="confidence"):
        prune_indices([-1, 0], [1.0], 2)
