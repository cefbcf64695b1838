import numpy as np
import pytest
from hypothesis import given
from strategies import trees

from lumotree.reference import TokenTree
from lumotree.reference.tree import ancestor_bits, ancestor_words, mask_bit


@given(trees(max_nodes=24))
def test_mask_depth_path_agree(parents):
    tree = TokenTree(parents)
    n = tree.num_nodes
    M = tree.ancestor_mask
    words, words8 = ancestor_words(parents), ancestor_words(parents, word_bits=8)
    assert all(0 <= w < 2**32 for row in words for w in row)
    assert M.shape == (n, n)
    assert np.all(np.diag(M))
    assert not np.any(np.triu(M, 1)), "ancestors precede: mask is lower triangular"
    for i in range(n):
        path = tree.path(i)
        assert path[0] == 0 and path[-1] == i
        assert len(path) == tree.depth[i] + 1
        assert set(np.flatnonzero(M[i]).tolist()) == set(path)
        for a, b in zip(path, path[1:]):
            assert tree.parents[b] == a
        for j in range(n):
            assert tree.is_ancestor(j, i) == bool(M[i, j])
            assert ((ancestor_bits(parents)[i] >> j) & 1) == M[i, j]
            assert mask_bit(words, i, j) == M[i, j] == mask_bit(words8, i, j, word_bits=8)
    # children and leaves are consistent with parents
    kids = [c for i in range(n) for c in tree.children(i)]
    assert sorted(kids) == list(range(1, n))
    assert set(tree.leaves) == {i for i in range(n) if not tree.children(i)}


@pytest.mark.parametrize(
    "parents, index",
    [
        ([], None),
        ([0], 0),
        ([-1, 1], 1),
        ([-1, 0, 3, 1], 2),
        ([-1, -1], 1),
        ([-1, 0, 2], 2),
    ],
)
def test_bad_parents_name_the_index(parents, index):
    with pytest.raises(ValueError) as err:
        TokenTree(parents)
    if index is not None:
        assert f"parents[{index}]" in str(err.value)


def test_bad_parent_types():
    with pytest.raises(ValueError, match=r"parents\[1\]"):
        TokenTree([-1, 0.0])
    with pytest.raises(ValueError, match=r"parents\[2\]"):
        TokenTree([-1, 0, "0"])
    with pytest.raises(ValueError, match="one-dimensional"):
        TokenTree(np.zeros((2, 2), dtype=int))


def test_from_sequences_builds_a_trie():
    tree = TokenTree.from_sequences(7, [[1, 2, 3], [1, 2, 4], [5], [1, 6]])
    assert tree.tokens[0] == 7
    assert tree.num_nodes == 7  # 7 -> 1 -> 2 -> {3, 4}; 7 -> 5; 1 -> 6
    paths = {tuple(tree.tokens[j] for j in tree.path(leaf)) for leaf in tree.leaves}
    assert paths == {(7, 1, 2, 3), (7, 1, 2, 4), (7, 5), (7, 1, 6)}
    assert tree.child_with_token(0, 1) is not None and tree.child_with_token(0, 9) is None


def test_duplicate_siblings_rejected_when_given_directly():
    with pytest.raises(ValueError, match=r"tokens\[2\]"):
        TokenTree([-1, 0, 0], tokens=[3, 4, 4])
    with pytest.raises(ValueError, match=r"tokens\[1\]"):
        TokenTree([-1, 0], tokens=[3, -4])


def test_render_shows_every_node():
    tree = TokenTree([-1, 0, 0, 1])
    text = tree.render()
    assert all(str(i) in text for i in range(4))


def test_random_parents_is_a_bounded_topological_tree():
    """The benchmarks' random tree: topological, at most ``max_children`` children a node, seeded, n = 1 allowed."""
    from lumotree.reference.tree import random_parents

    for n, k in ((1, 4), (2, 1), (64, 4), (200, 2)):
        parents = random_parents(n, np.random.default_rng(n), max_children=k)
        tree = TokenTree(parents)  # validates: root first, parents before children
        assert tree.num_nodes == n
        assert all(len(tree.children(i)) <= k for i in range(n))
        assert parents == random_parents(n, np.random.default_rng(n), max_children=k)
    assert random_parents(50, np.random.default_rng(0), max_children=1) == list(range(-1, 49))  # k = 1: a chain
    with pytest.raises(ValueError, match="n = 0"):
        random_parents(0, np.random.default_rng(0))


@pytest.mark.parametrize("build, n", [(TokenTree.chain, 0), (TokenTree.chain, -3), (TokenTree.star, 0),
                                      (TokenTree.chain, 2.0), (TokenTree.star, True)])
def test_chain_and_star_refuse_sizes_below_one(build, n):
    with pytest.raises(ValueError, match=rf"^n = {n!r} must be a positive integer"):
        build(n)
    assert TokenTree.chain(1) == TokenTree.star(1) == TokenTree([-1])


def test_render_needs_one_label_per_node():
    tree = TokenTree([-1, 0, 0])
    assert tree.render(["r", "a", "b"]).splitlines() == ["r", "├─ a", "└─ b"]
    with pytest.raises(ValueError, match=r"^labels has 2 entries but the tree has 3 nodes$"):
        tree.render(["r", "a"])
    with pytest.raises(TypeError, match=r"^labels must be a sequence"):
        tree.render("rab")


def test_positions_and_slots_are_prefix_plus_depth_and_index():
    from lumotree.reference.tree import child_depth, node_position, tree_slot

    tree = TokenTree([-1, 0, 0, 2, 3])
    assert tree.depth.tolist() == [0, 1, 1, 2, 3] and child_depth(2) == 3
    assert node_position(7, tree.depth).tolist() == [7, 8, 8, 9, 10]
    assert [tree_slot(7, i) for i in range(5)] == [7, 8, 9, 10, 11]
