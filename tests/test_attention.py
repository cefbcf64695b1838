"""Gated attention: HF q_proj layout, partial RoPE, the tree (ancestor-mask) attention core against dense per-path
attention, layer-level tree verify and KV compaction against decoding each path."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import trees

from lumotree.reference import TokenTree
from lumotree.reference import attention as attn


def rel(a, b):
    return np.linalg.norm(np.asarray(a) - np.asarray(b)) / max(np.linalg.norm(np.asarray(b)), 1e-300)


def random_layer(rng, spec: attn.AttentionSpec) -> attn.AttentionWeights:
    shapes = spec.weight_shapes()
    return attn.AttentionWeights(
        **{name: (rng.standard_normal(shape) / np.sqrt(shape[-1]) if len(shape) == 2 else rng.normal(0, 0.1, shape))
           for name, shape in shapes.items()}
    )


def test_query_gate_layout_is_interleaved_per_head():
    Hq, Dh, D = 3, 2, 4
    w_query, w_gate = np.arange(24.0).reshape(6, 4), -np.arange(24.0).reshape(6, 4) - 1
    packed = attn.pack_query_gate(w_query, w_gate, Hq)
    np.testing.assert_array_equal(packed[2 * Dh : 3 * Dh], w_query[Dh : 2 * Dh])  # head 1: query rows, then gate
    np.testing.assert_array_equal(packed[3 * Dh : 4 * Dh], w_gate[Dh : 2 * Dh])
    for got, want in zip(attn.unpack_query_gate(packed, Hq), (w_query, w_gate)):
        np.testing.assert_array_equal(got, want)
    assert packed.shape == (2 * Hq * Dh, D)


def test_rope_is_a_complex_rotation_of_channel_pairs():
    rng = np.random.default_rng(0)
    T, heads, Dh, rd, theta = 5, 2, 8, 4, 100.0
    x = rng.standard_normal((T, heads, Dh))
    positions = np.array([0, 1, 7, 30, 31])
    cos, sin = attn.rope_cos_sin(positions, rd, theta)
    out = attn.apply_rope(x, cos, sin)
    half = rd // 2
    for m in range(half):  # pair (m, m + rd/2) rotates by pos * theta^(-2m/rd)
        z = (x[..., m] + 1j * x[..., m + half]) * np.exp(1j * positions[:, None] * theta ** (-2 * m / rd))
        np.testing.assert_allclose(out[..., m], z.real, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(out[..., m + half], z.imag, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(out[..., rd:], x[..., rd:])  # the other channels pass through
    # scores depend on relative positions only
    q, k = rng.standard_normal((1, 1, Dh)), rng.standard_normal((1, 1, Dh))

    def score(pq, pk):
        cq, sq = attn.rope_cos_sin(np.array([pq]), rd, theta)
        ck, sk = attn.rope_cos_sin(np.array([pk]), rd, theta)
        return float(attn.apply_rope(q, cq, sq).ravel() @ attn.apply_rope(k, ck, sk).ravel())

    assert score(9, 4) == pytest.approx(score(25, 20), rel=1e-12)


def dense_path_attention(q_i, keys, values, scale):
    """Reference softmax attention of one query ``[Hq, Dh]`` over ``keys, values: [n, Hkv, Dh]`` (GQA by repeat)."""
    group = q_i.shape[0] // keys.shape[1]
    k_rep, v_rep = np.repeat(keys, group, axis=1), np.repeat(values, group, axis=1)  # [n, Hq, Dh]
    scores = np.einsum("hd,nhd->hn", q_i, k_rep) * scale
    p = np.exp(scores) / np.exp(scores).sum(axis=1, keepdims=True)
    return np.einsum("hn,nhd->hd", p, v_rep)


@settings(max_examples=20)
@given(parents=trees(max_nodes=16), group=st.sampled_from([1, 2]), L=st.integers(0, 5), seed=st.integers(0, 2**31))
def test_tree_attention_core_equals_attention_over_cache_and_path(parents, group, L, seed):
    rng = np.random.default_rng(seed)
    tree = TokenTree(parents)
    N, Hkv, Dh = tree.num_nodes, 2, 4
    q = rng.standard_normal((N, Hkv * group, Dh))
    k_cache, v_cache = rng.standard_normal((L, Hkv, Dh)), rng.standard_normal((L, Hkv, Dh))
    k_tree, v_tree = rng.standard_normal((N, Hkv, Dh)), rng.standard_normal((N, Hkv, Dh))
    o = attn.tree_attention_core(q, k_cache, v_cache, k_tree, v_tree, tree, 0.5)
    for i in range(N):
        path = tree.path(i)
        want = dense_path_attention(q[i], np.concatenate([k_cache, k_tree[path]]),
                                    np.concatenate([v_cache, v_tree[path]]), 0.5)
        assert rel(o[i], want) < 1e-13


def test_tree_attention_core_runs_on_sympy():
    sympy = pytest.importorskip("sympy")
    tree = TokenTree([-1, 0, 0])

    def sym(name, shape):
        return np.array(sympy.symbols(f"{name}0:{int(np.prod(shape))}"), dtype=object).reshape(shape)

    q, kc, vc, kt, vt = sym("q", (3, 1, 1)), sym("a", (1, 1, 1)), sym("b", (1, 1, 1)), sym("k", (3, 1, 1)), \
        sym("v", (3, 1, 1))
    o = attn.tree_attention_core(q, kc, vc, kt, vt, tree, 1, exp=sympy.exp)
    # node 2 sees the cache entry, the root and itself; not its sibling 1
    e = [sympy.exp(q[2, 0, 0] * kk) for kk in (kc[0, 0, 0], kt[0, 0, 0], kt[2, 0, 0])]
    want = (e[0] * vc[0, 0, 0] + e[1] * vt[0, 0, 0] + e[2] * vt[2, 0, 0]) / (e[0] + e[1] + e[2])
    assert sympy.simplify(o[2, 0, 0] - want) == 0
    assert not o[2, 0, 0].has(kt[1, 0, 0])
    with pytest.raises(TypeError, match="exp="):
        attn.tree_attention_core(q, kc, vc, kt, vt, tree, 1)


@settings(max_examples=12)
@given(parents=trees(max_nodes=10), group=st.sampled_from([1, 2]), seed=st.integers(0, 2**31))
def test_layer_tree_verify_and_kv_compaction_equal_path_decoding(parents, group, seed):
    rng = np.random.default_rng(seed)
    tree = TokenTree(parents)
    spec = attn.AttentionSpec(hidden_size=8, num_heads=2 * group, num_kv_heads=2, head_dim=8, rotary_dim=2,
                              rope_theta=50.0)
    weights = random_layer(rng, spec)
    _, cache = attn.attention_layer_chain(rng.standard_normal((4, 8)), weights, spec, attn.KVCache.empty(spec))
    x = rng.standard_normal((tree.num_nodes, 8))
    out, record = attn.attention_layer_tree(x, weights, spec, cache, tree)
    assert cache.length == 4
    for leaf in tree.leaves:
        path_cache, want = cache, []
        for node in tree.path(leaf):
            o, path_cache = attn.attention_layer_chain(x[node : node + 1], weights, spec, path_cache)
            want.append(o[0])
        assert rel(out[tree.path(leaf)], np.array(want)) < 1e-12
        committed = attn.attention_layer_commit(record, cache, tree, leaf)
        assert committed.length == 4 + len(tree.path(leaf))
        assert rel(committed.keys, path_cache.keys) < 1e-13 and rel(committed.values, path_cache.values) < 1e-13


def test_kv_commit_keeps_the_path_in_order():
    tree = TokenTree([-1, 0, 0, 2, 2, 4])
    k_tree = np.arange(6.0).reshape(6, 1, 1)
    keys, values = attn.kv_commit(np.full((2, 1, 1), -1.0), np.zeros((2, 1, 1)), k_tree, k_tree * 10, tree, 5)
    assert keys.ravel().tolist() == [-1, -1, 0, 2, 4, 5]
    assert values.ravel().tolist() == [0, 0, 0, 20, 40, 50]


def test_bad_inputs_name_the_argument():
    tree = TokenTree([-1, 0])
    q, kc, kt = np.zeros((2, 2, 4)), np.zeros((3, 1, 4)), np.zeros((2, 1, 4))
    bad = q.copy()
    bad[0, 1, 2] = np.nan
    with pytest.raises(ValueError, match=r"^q contains NaN"):
        attn.tree_attention_core(bad, kc, kc, kt, kt, tree, 0.5)
    with pytest.raises(ValueError, match=r"^k_tree has shape"):
        attn.tree_attention_core(q, kc, kc, kt[:1], kt, tree, 0.5)
    with pytest.raises(ValueError, match=r"^v_cache has shape"):
        attn.tree_attention_core(q, kc, kc[:2], kt, kt, tree, 0.5)
    with pytest.raises(ValueError, match="not a multiple"):
        attn.tree_attention_core(np.zeros((2, 3, 4)), np.zeros((3, 2, 4)), np.zeros((3, 2, 4)), np.zeros((2, 2, 4)),
                                 np.zeros((2, 2, 4)), tree, 0.5)
    with pytest.raises(ValueError, match="rotary_dim"):
        attn.AttentionSpec(hidden_size=8, num_heads=2, num_kv_heads=1, head_dim=8, rotary_dim=3)
    with pytest.raises(ValueError, match="positions"):
        attn.rope_cos_sin(np.array([-1]), 4, 10.0)
    spec = attn.AttentionSpec(hidden_size=8, num_heads=2, num_kv_heads=1, head_dim=8, rotary_dim=2)
    weights = random_layer(np.random.default_rng(0), spec)
    weights.q_proj = weights.q_proj[:-1]
    with pytest.raises(ValueError, match=r"AttentionWeights\.q_proj has shape"):
        weights.validate(spec)


def test_nan_scale_and_a_parent_list_in_place_of_a_tree_name_the_argument():
    tree = TokenTree([-1, 0])
    q, kc, kt = np.zeros((2, 2, 4)), np.zeros((3, 1, 4)), np.zeros((2, 1, 4))
    with pytest.raises(ValueError, match=r"^scale = nan is not finite$"):
        attn.tree_attention_core(q, kc, kc, kt, kt, tree, float("nan"))
    with pytest.raises(TypeError, match=r"^tree must be a TokenTree .*got list$"):
        attn.tree_attention_core(q, kc, kc, kt, kt, [-1, 0], 0.5)
    with pytest.raises(TypeError, match=r"^tree must be a TokenTree"):
        attn.kv_commit(kc, kc, kt, kt, (-1, 0), 1)


def test_kv_commit_compacts_in_place_behind_the_cache():
    """The tree pass leaves node j at slot L + j; each path node moves to L + depth(j), root first, and the cache
    ends after the accepted node: the same cache as appending the path (a move never clobbers a later source)."""
    tree = TokenTree([-1, 0, 1, 0, 3, 4, 2, 6])
    k_cache, k_tree = np.full((3, 1, 1), -1.0), np.arange(8.0).reshape(8, 1, 1)
    for node in range(8):
        keys, _ = attn.kv_commit(k_cache, k_cache, k_tree, k_tree, tree, node)
        assert keys.ravel().tolist() == [-1, -1, -1] + [float(j) for j in tree.path(node)]
