"""The GDN layer: HF weight layouts, the tree-window short convolution and its commit, and layer-level tree verify
(closed form) equal to decoding each path with the recurrence."""

from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import to_fractions, trees

from lumotree.reference import TokenTree, gdn


def random_layer(rng, spec: gdn.GDNLayerSpec) -> gdn.GDNWeights:
    """Weights of useful size (projections N(0, 1/D), conv N(0, 0.25), decays mostly in 0.2 .. 0.95)."""
    shapes = spec.weight_shapes()
    D = spec.hidden_size
    return gdn.GDNWeights(
        in_proj_qkvz=rng.standard_normal(shapes["in_proj_qkvz"]) / np.sqrt(D),
        in_proj_ba=rng.standard_normal(shapes["in_proj_ba"]) / np.sqrt(D),
        conv1d=rng.normal(0, 0.5, shapes["conv1d"]),
        A_log=np.log(rng.uniform(0.1, 2.0, shapes["A_log"])),
        dt_bias=rng.normal(0, 0.5, shapes["dt_bias"]),
        norm=1 + rng.normal(0, 0.1, shapes["norm"]),
        out_proj=rng.standard_normal(shapes["out_proj"]) / np.sqrt(spec.value_dim),
    )


def rel(a, b):
    return np.linalg.norm(np.asarray(a) - np.asarray(b)) / max(np.linalg.norm(np.asarray(b)), 1e-300)


# ---------------------------------------------------------------------------------------------------- layouts
def test_qkvz_and_ba_layout_is_grouped_per_key_head():
    spec = gdn.GDNLayerSpec(hidden_size=3, num_k_heads=2, num_v_heads=4, head_k_dim=2, head_v_dim=3)
    H, K, V, r = 2, 2, 3, 2
    parts = [np.arange(rows * 3, dtype=float).reshape(rows, 3) + 1000 * n
             for n, rows in enumerate((H * K, H * K, 4 * V, 4 * V))]
    packed = gdn.pack_qkvz(*parts, num_k_heads=H)
    assert packed.shape == spec.weight_shapes()["in_proj_qkvz"]
    per_head = 2 * K + 2 * r * V
    # key head 1's block: q rows K.., then k rows, then the v rows of value heads 2 and 3, then their z rows
    block = packed[per_head : 2 * per_head]
    np.testing.assert_array_equal(block[:K], parts[0][K:])
    np.testing.assert_array_equal(block[K : 2 * K], parts[1][K:])
    np.testing.assert_array_equal(block[2 * K : 2 * K + r * V], parts[2][r * V :])
    np.testing.assert_array_equal(block[2 * K + r * V :], parts[3][r * V :])
    for got, want in zip(gdn.unpack_qkvz(packed, spec), parts):
        np.testing.assert_array_equal(got, want)
    w_b, w_a = np.arange(12.0).reshape(4, 3), -np.arange(12.0).reshape(4, 3)
    packed_ba = gdn.pack_ba(w_b, w_a, num_k_heads=H)
    np.testing.assert_array_equal(packed_ba[r : 2 * r], w_a[:r])  # key head 0: b_0 b_1 a_0 a_1
    for got, want in zip(gdn.unpack_ba(packed_ba, spec), (w_b, w_a)):
        np.testing.assert_array_equal(got, want)


# ---------------------------------------------------------------------------------------------------- conv on trees
def test_conv_window_index_example():
    tree = TokenTree([-1, 0, 0, 1, 3])
    # rows 0..2 = conv state (oldest first), row 3 + j = node j
    expected = [[0, 1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 5], [2, 3, 4, 6], [3, 4, 6, 7]]
    np.testing.assert_array_equal(gdn.conv_window_index(tree, 4), expected)


def causal_conv(sequence: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """HF's depthwise conv (F.conv1d is a cross-correlation) over ``sequence: [T, C]`` without padding (the sequence
    already holds the left context): ``[T - W + 1, C]``."""
    return np.stack([np.correlate(sequence[:, c], weight[c], mode="valid") for c in range(weight.shape[0])], axis=1)


def test_causal_conv_helper_is_torch_conv1d():
    rng = np.random.default_rng(0)
    sequence, weight = rng.standard_normal((6, 3)), rng.standard_normal((3, 4))
    want = torch.nn.functional.conv1d(torch.from_numpy(sequence.T[None]), torch.from_numpy(weight[:, None, :]),
                                      groups=3)[0].numpy().T
    np.testing.assert_allclose(causal_conv(sequence, weight), want, rtol=1e-12)


@settings(max_examples=20)
@given(parents=trees(max_nodes=16), kernel=st.sampled_from([2, 4]), seed=st.integers(0, 2**31))
def test_tree_conv_is_the_causal_conv_of_each_path(parents, kernel, seed):
    rng = np.random.default_rng(seed)
    tree = TokenTree(parents)
    C = 3
    inputs, state = rng.standard_normal((tree.num_nodes, C)), rng.standard_normal((kernel - 1, C))
    weight = rng.standard_normal((C, kernel))
    out = gdn.short_conv(inputs, state, weight, tree)
    for node in range(tree.num_nodes):
        sequence = np.concatenate([state, inputs[tree.path(node)]])  # [W - 1 + depth + 1, C]
        np.testing.assert_allclose(out[node], causal_conv(sequence, weight)[-1], rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(gdn.conv_state_commit(inputs, state, tree, node), sequence[-(kernel - 1) :])


def test_tree_conv_runs_on_sympy_and_fractions():
    sympy = pytest.importorskip("sympy")
    tree = TokenTree([-1, 0, 0, 2])
    C, W = 2, 4

    def sym(name, shape):
        return np.array(sympy.symbols(f"{name}0:{int(np.prod(shape))}"), dtype=object).reshape(shape)

    inputs, state, weight = sym("u", (4, C)), sym("s", (W - 1, C)), sym("w", (C, W))
    out = gdn.short_conv(inputs, state, weight, tree)
    # node 3's window: s2, u0, u2, u3
    for c in range(C):
        want = weight[c, 0] * state[2, c] + weight[c, 1] * inputs[0, c] + weight[c, 2] * inputs[2, c] \
            + weight[c, 3] * inputs[3, c]
        assert sympy.expand(out[3, c] - want) == 0
    assert list(gdn.conv_state_commit(inputs, state, tree, 3)[:, 0]) == [inputs[0, 0], inputs[2, 0], inputs[3, 0]]
    rng = np.random.default_rng(0)
    exact = gdn.short_conv(to_fractions(rng.standard_normal((4, C))), to_fractions(rng.standard_normal((W - 1, C))),
                           to_fractions(rng.standard_normal((C, W))), tree)
    assert all(isinstance(x, Fraction) for x in exact.flat)
    with pytest.raises(TypeError, match="weight"):
        gdn.short_conv(to_fractions(np.ones((4, C))), to_fractions(np.ones((W - 1, C))), np.ones((C, W)), tree)


# ---------------------------------------------------------------------------------------------------- gates, norms
def test_gates_formula_and_neg_eigval():
    a = np.array([[-3.0, 0.0, 2.5]])
    b = np.array([[-1.0, 0.0, 4.0]])
    A_log, dt_bias = np.log(np.array([0.5, 1.0, 8.0])), np.array([0.3, -0.2, 0.0])
    alpha, beta = gdn.gates(a, b, A_log, dt_bias)
    for h in range(3):
        g = -np.exp(A_log[h]) * np.log1p(np.exp(a[0, h] + dt_bias[h]))
        assert alpha[0, h] == pytest.approx(np.exp(g), rel=1e-14)
        assert beta[0, h] == pytest.approx(1 / (1 + np.exp(-b[0, h])), rel=1e-14)
    assert np.all((alpha > 0) & (alpha <= 1))
    _, beta2 = gdn.gates(a, b, A_log, dt_bias, allow_neg_eigval=True)
    np.testing.assert_allclose(beta2, 2 * beta, rtol=1e-15)


def test_l2norm_and_gated_rmsnorm():
    x = np.array([[3.0, 4.0]])
    np.testing.assert_allclose(gdn.l2norm(x), x / np.sqrt(25 + 1e-6), rtol=1e-15)
    o, z, w = np.array([[1.0, -2.0, 2.0]]), np.array([[0.5, -1.0, 3.0]]), np.array([1.0, 2.0, 0.5])
    rms = np.sqrt((1 + 4 + 4) / 3 + 1e-6)
    want = w * (o / rms) * z / (1 + np.exp(-z))
    np.testing.assert_allclose(gdn.gated_rmsnorm(o, z, w, 1e-6), want, rtol=1e-14)


# ---------------------------------------------------------------------------------------------------- the layer
def decode_path(x, weights, spec, cache, path):
    """Run the nodes of ``path`` one token at a time through the recurrent layer; returns (outputs, cache)."""
    outs = []
    for node in path:
        out, cache = gdn.gdn_layer_chain(x[node : node + 1], weights, spec, cache)
        outs.append(out[0])
    return np.array(outs), cache


@settings(max_examples=15)
@given(parents=trees(max_nodes=12), group=st.sampled_from([1, 2]), neg=st.booleans(), seed=st.integers(0, 2**31))
def test_layer_tree_verify_and_commit_equal_path_decoding(parents, group, neg, seed):
    rng = np.random.default_rng(seed)
    tree = TokenTree(parents)
    spec = gdn.GDNLayerSpec(hidden_size=8, num_k_heads=2, num_v_heads=2 * group, head_k_dim=4, head_v_dim=3,
                            allow_neg_eigval=neg)
    weights = random_layer(rng, spec)
    _, cache = gdn.gdn_layer_chain(rng.standard_normal((5, 8)), weights, spec, gdn.GDNLayerCache.empty(spec))
    before = cache.copy()
    x = rng.standard_normal((tree.num_nodes, 8))
    out, record = gdn.gdn_layer_tree(x, weights, spec, cache, tree)
    np.testing.assert_array_equal(cache.state, before.state)  # verify leaves the cache alone
    np.testing.assert_array_equal(cache.conv_state, before.conv_state)
    for leaf in tree.leaves:
        path = tree.path(leaf)
        want, path_cache = decode_path(x, weights, spec, cache, path)
        assert rel(out[path], want) < 1e-12
        committed = gdn.gdn_layer_commit(record, cache, tree, leaf)
        assert rel(committed.state, path_cache.state) < 1e-12
        assert rel(committed.conv_state, path_cache.conv_state) < 1e-13  # the inputs differ by matmul rounding


def test_prefill_equals_token_by_token_decode():
    rng = np.random.default_rng(1)
    spec = gdn.GDNLayerSpec(hidden_size=8, num_k_heads=1, num_v_heads=2, head_k_dim=4, head_v_dim=4)
    weights = random_layer(rng, spec)
    x = rng.standard_normal((7, 8))
    out, cache = gdn.gdn_layer_chain(x, weights, spec, gdn.GDNLayerCache.empty(spec))
    want, step_cache = decode_path(x, weights, spec, gdn.GDNLayerCache.empty(spec), range(7))
    assert rel(out, want) < 1e-13 and rel(cache.state, step_cache.state) < 1e-13
    assert rel(cache.conv_state, step_cache.conv_state) < 1e-13


# ---------------------------------------------------------------------------------------------------- bad input
def test_bad_inputs_name_the_argument():
    rng = np.random.default_rng(2)
    spec = gdn.GDNLayerSpec(hidden_size=8, num_k_heads=1, num_v_heads=2, head_k_dim=4, head_v_dim=4)
    weights = random_layer(rng, spec)
    cache = gdn.GDNLayerCache.empty(spec)
    tree = TokenTree([-1, 0])
    x = rng.standard_normal((2, 8))
    bad = x.copy()
    bad[1, 3] = np.nan
    with pytest.raises(ValueError, match=r"^x contains NaN"):
        gdn.gdn_layer_tree(bad, weights, spec, cache, tree)
    with pytest.raises(ValueError, match=r"^x has shape"):
        gdn.gdn_layer_tree(x[:1], weights, spec, cache, tree)
    with pytest.raises(ValueError, match=r"^conv_state has shape"):
        gdn.short_conv(np.zeros((2, 3)), np.zeros((3, 4)), np.zeros((3, 4)), tree)
    with pytest.raises(ValueError, match=r"^weight has shape"):
        gdn.short_conv(np.zeros((2, 3)), np.zeros((3, 3)), np.zeros((3, 5)), tree)
    poisoned = cache.copy()
    poisoned.state[0, 0, 0] = np.inf
    with pytest.raises(ValueError, match=r"^S0 contains NaN or inf"):
        gdn.gdn_layer_tree(x, weights, spec, poisoned, tree)
    weights.conv1d = weights.conv1d[:, :3]
    with pytest.raises(ValueError, match=r"GDNWeights\.conv1d has shape"):
        weights.validate(spec)
    with pytest.raises(ValueError, match="num_v_heads"):
        gdn.GDNLayerSpec(hidden_size=8, num_k_heads=2, num_v_heads=3, head_k_dim=4, head_v_dim=4)
