"""Tree attention kernels (lumotree.optimized.ops.tree_attention) against the exact reference attention.

CPU: the Triton interpreter on small float32 shapes, outputs NaN-poisoned before each call and the cache poisoned
past each request's ``L + N`` (the kernel must never read there). GPU (``pytest -m gpu``): bf16 at Qwen3-Next shapes
against the float64 reference on the same bf16-rounded inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import build_tree_parents, trees

from lumotree.optimized.ops import tree_attention as ta
from lumotree.optimized.ops.tree_meta import tree_metadata
from lumotree.reference import attention as ref_attn
from lumotree.reference.tree import TokenTree, ancestor_words

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _signed(words: list[list[int]]) -> list[list[int]]:
    return [[w - (1 << 32) if w >= 1 << 31 else w for w in row] for row in words]


def _batch_parents(parent_lists: list[list[int]]) -> torch.Tensor:
    return torch.tensor(parent_lists, dtype=torch.int32, device=DEVICE)  # [B, N]


def _make_batch(rng, parent_lists, lens, HQ, HKV, D, dtype, extra_capacity=3):
    """Random pool (poisoned past L + N), slots in shuffled order, queries, gates."""
    B, N = len(parent_lists), len(parent_lists[0])
    P = B + 2
    C = max(lens) + N + extra_capacity
    k_cache = torch.randn(P, HKV, C, D, dtype=torch.float64)  # [P, HKV, C, D]
    v_cache = torch.randn(P, HKV, C, D, dtype=torch.float64)
    slots = rng.permutation(P)[:B]
    for b in range(B):  # nothing past the tree may ever be read
        k_cache[slots[b], :, lens[b] + N :] = float("nan")
        v_cache[slots[b], :, lens[b] + N :] = float("nan")
    q = torch.randn(B, N, HQ, D, dtype=torch.float64)
    gate = torch.randn(B, N, HQ, D, dtype=torch.float64) * 2
    to = dict(device=DEVICE, dtype=dtype)
    return (q.to(**to), gate.to(**to), k_cache.to(**to), v_cache.to(**to),
            torch.tensor(slots, dtype=torch.int32, device=DEVICE), torch.tensor(lens, dtype=torch.int32, device=DEVICE))


def _reference_output(q, gate, k_cache, v_cache, slots, lens, parent_lists):
    """Float64 reference: ``tree_attention_core * sigmoid(gate)`` per request, on the kernel's own inputs."""
    outs = []
    for b, parents in enumerate(parent_lists):
        N, L, s = len(parents), int(lens[b]), int(slots[b])
        kc = k_cache[s].double().cpu().numpy().transpose(1, 0, 2)  # [C, HKV, D]
        vc = v_cache[s].double().cpu().numpy().transpose(1, 0, 2)
        qb = q[b].double().cpu().numpy()  # [N, HQ, D]
        o = ref_attn.tree_attention_core(qb, kc[:L], vc[:L], kc[L : L + N], vc[L : L + N], TokenTree(parents),
                                         qb.shape[-1] ** -0.5)  # [N, HQ, D]
        outs.append(o / (1.0 + np.exp(-gate[b].double().cpu().numpy())))
    return np.stack(outs)


# ------------------------------------------------------------------------------------------------ tree metadata
@settings(max_examples=25)
@given(st.lists(trees(max_nodes=70), min_size=1, max_size=3), st.integers(0, 2**31))
def test_tree_metadata_matches_reference_words_and_depth(tree_list, seed):
    n = max(len(p) for p in tree_list)
    rng = np.random.default_rng(seed)
    # pad every tree to the batch's N with extra random leaves (the engine's padding)
    rows = [p + [int(rng.integers(0, len(p) + k)) for k in range(n - len(p))] for p in tree_list]
    meta = tree_metadata(_batch_parents(rows))
    for b, parents in enumerate(rows):
        assert meta.words[b].tolist() == _signed(ancestor_words(parents))
        assert meta.depth[b].tolist() == TokenTree(parents).depth.tolist()


@settings(max_examples=20)
@given(st.lists(trees(max_nodes=130), min_size=1, max_size=3), st.integers(0, 2**31))
def test_tree_metadata_with_num_nodes_reads_only_real_nodes(tree_list, seed):
    """With ``num_nodes`` the real nodes' words and depths are the reference's, whatever the padding entries hold
    (garbage, even out-of-range values: they are not read), from int64 parents in a strided view; the padding rows
    are those of a chain below the last real node. Covers single nodes, chains and more than 64 and 128 nodes."""
    n = max(len(p) for p in tree_list)
    rng = np.random.default_rng(seed)
    junk = torch.tensor([p + [int(rng.integers(-9, 999)) for _ in range(n - len(p))] for p in tree_list])  # [B, N]
    wide = torch.full((len(tree_list), 2 * n), 7, dtype=torch.int64)
    wide[:, ::2] = junk
    parents = wide.to(DEVICE)[:, ::2]  # [B, N] stride 2 along the nodes
    num_nodes = torch.tensor([len(p) for p in tree_list], dtype=torch.int32, device=DEVICE)
    words = tree_metadata(parents, num_nodes=num_nodes, validate=False)
    checked = tree_metadata(parents, num_nodes=num_nodes)
    assert torch.equal(words.words, checked.words) and torch.equal(words.depth, checked.depth)
    for b, real in enumerate(tree_list):
        chain = real + list(range(len(real) - 1, n - 1))  # the padding read as a chain
        assert words.words[b].tolist() == _signed(ancestor_words(chain))
        assert words.depth[b].tolist() == TokenTree(chain).depth.tolist()
    with pytest.raises(ValueError, match="num_nodes"):
        tree_metadata(parents, num_nodes=num_nodes * 0)


def test_tree_metadata_rejects_bad_trees():
    with pytest.raises(ValueError, match=r"parents\[1\]\[0\] = 0"):
        tree_metadata(_batch_parents([[-1, 0, 1], [0, 0, 1]]))
    with pytest.raises(ValueError, match=r"parents\[0\]\[2\] = 2"):
        tree_metadata(_batch_parents([[-1, 0, 2]]))
    with pytest.raises(TypeError, match="parents"):
        tree_metadata(torch.zeros(1, 3, dtype=torch.float32))


# ------------------------------------------------------------------------------------------- norm + RoPE + store
@pytest.mark.parametrize("HQ,HKV,D,rot", [(4, 2, 32, 8), (2, 2, 16, 16), (6, 3, 24, 6)])
def test_prepare_qkv_matches_reference_projection(HQ, HKV, D, rot):
    rng = np.random.default_rng(HQ * 100 + D)
    torch.manual_seed(D)
    parent_lists = [build_tree_parents("random", 6, rng), build_tree_parents("chain", 6, rng)]
    lens = [0, 11]
    q, _, k_cache, v_cache, slots, lens_t = _make_batch(rng, parent_lists, lens, HQ, HKV, D, torch.float32)
    before = k_cache.clone()
    q_raw = torch.randn(2, 6, HQ, 2 * D, device=DEVICE)[..., :D]  # the query half of q_proj's [query | gate] rows
    k = torch.randn(2, 6, HKV, D, device=DEVICE)
    v = torch.randn(2, 6, HKV, D, device=DEVICE)
    qw, kw = torch.randn(D, device=DEVICE) * 0.3, torch.randn(D, device=DEVICE) * 0.3
    spec = ref_attn.AttentionSpec(hidden_size=8, num_heads=HQ, num_kv_heads=HKV, head_dim=D, rotary_dim=rot,
                                  rope_theta=1000.0, eps=1e-6)
    meta = tree_metadata(_batch_parents(parent_lists))
    out = torch.full((2, 6, HQ, D), float("nan"), device=DEVICE)
    ta.prepare_qkv(q_raw, k, v, qw, kw, ta.rope_inv_freq(rot, spec.rope_theta, DEVICE), meta.depth, k_cache,
                   v_cache, slots, lens_t, eps=spec.eps, out=out)
    for b, parents in enumerate(parent_lists):
        positions = lens[b] + TokenTree(parents).depth
        cos, sin = ref_attn.rope_cos_sin(positions, rot, spec.rope_theta)
        q_ref = ref_attn.apply_rope(ref_attn.zero_centred_rmsnorm(q_raw[b].double().numpy(), qw.double().numpy(),
                                                                  spec.eps), cos, sin)
        k_ref = ref_attn.apply_rope(ref_attn.zero_centred_rmsnorm(k[b].double().numpy(), kw.double().numpy(),
                                                                  spec.eps), cos, sin)
        np.testing.assert_allclose(out[b].double().numpy(), q_ref, rtol=1e-5, atol=1e-5)
        s, L = int(slots[b]), lens[b]
        np.testing.assert_allclose(k_cache[s, :, L : L + 6].double().numpy().transpose(1, 0, 2), k_ref,
                                   rtol=1e-5, atol=1e-5)
        assert torch.equal(v_cache[s, :, L : L + 6].transpose(0, 1), v[b])
        untouched = torch.ones(k_cache.shape[2], dtype=torch.bool)
        untouched[L : L + 6] = False
        assert torch.equal(k_cache[s][:, untouched].nan_to_num(7.0), before[s][:, untouched].nan_to_num(7.0))


# ------------------------------------------------------------------------------------------------- attention
@settings(max_examples=10)
@given(
    tree_list=st.lists(trees(max_nodes=20), min_size=1, max_size=3),
    lens=st.lists(st.sampled_from([0, 1, 5, 16, 37, 70]), min_size=3, max_size=3),
    gqa=st.sampled_from([(2, 2), (4, 2), (4, 1), (8, 2)]),
    num_splits=st.sampled_from([1, 2, 5]),
    seed=st.integers(0, 2**31),
)
def test_tree_attention_matches_reference(tree_list, lens, gqa, num_splits, seed):
    HQ, HKV = gqa
    D = 16
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed % 2**31)
    n = max(len(p) for p in tree_list)
    rows = [p + [int(rng.integers(0, len(p) + k)) for k in range(n - len(p))] for p in tree_list]
    lens = lens[: len(rows)]
    q, gate, k_cache, v_cache, slots, lens_t = _make_batch(rng, rows, lens, HQ, HKV, D, torch.float32)
    meta = tree_metadata(_batch_parents(rows))
    out = torch.full_like(q, float("nan"))
    ta.tree_attention(q, k_cache, v_cache, slots, lens_t, meta.words, gate=gate, num_splits=num_splits, out=out,
                      launch=ta.AttentionLaunch(block_n=16))
    expected = _reference_output(q, gate, k_cache, v_cache, slots, lens, rows)
    assert not torch.isnan(out).any()
    np.testing.assert_allclose(out.double().cpu().numpy(), expected, rtol=2e-5, atol=2e-6)


@settings(max_examples=8)
@given(
    tree_list=st.lists(trees(max_nodes=40), min_size=1, max_size=2),
    lens=st.lists(st.sampled_from([0, 3, 16, 45, 96]), min_size=2, max_size=2),
    num_splits=st.sampled_from([2, 3, 6]),
    tree_slack=st.sampled_from([1, 2, 5, 300]),
    combine_block_d=st.sampled_from([None, 16]),
    seed=st.integers(0, 2**31),
)
def test_tree_attention_tree_slack_matches_reference(tree_list, lens, num_splits, tree_slack, combine_block_d, seed):
    """Uneven work splits (the last split gives up committed tiles for the tree's; 300: it keeps none and the
    trailing splits of the others are empty) and narrow combine column blocks give the reference output."""
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed % 2**31)
    n = max(len(p) for p in tree_list)
    rows = [p + [int(rng.integers(0, len(p) + k)) for k in range(n - len(p))] for p in tree_list]
    lens = lens[: len(rows)]
    q, gate, k_cache, v_cache, slots, lens_t = _make_batch(rng, rows, lens, 4, 2, 16, torch.float32)
    meta = tree_metadata(_batch_parents(rows))
    out = torch.full_like(q, float("nan"))
    ta.tree_attention(q, k_cache, v_cache, slots, lens_t, meta.words, gate=gate, num_splits=num_splits, out=out,
                      launch=ta.AttentionLaunch(block_n=16, tree_slack=tree_slack, combine_block_d=combine_block_d))
    expected = _reference_output(q, gate, k_cache, v_cache, slots, lens, rows)
    assert not torch.isnan(out).any()
    np.testing.assert_allclose(out.double().cpu().numpy(), expected, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("tree_slack", [0, 1, 4])
def test_tree_attention_tree_slack_at_bench_shape_ratio(tree_slack):
    """The B = 1 bench layout scaled down: GQA 8 (two kv heads), 2 row blocks of 4 nodes x 8 heads, a committed
    length that is not a multiple of the tile, every split count from 1 to 7."""
    rng = np.random.default_rng(11 + tree_slack)
    rows = [build_tree_parents("deep_wide", 8, rng)]
    q, gate, k_cache, v_cache, slots, lens_t = _make_batch(rng, rows, [77], 16, 2, 16, torch.float32)
    meta = tree_metadata(_batch_parents(rows))
    expected = _reference_output(q, gate, k_cache, v_cache, slots, [77], rows)
    for splits in range(1, 8):
        out = torch.full_like(q, float("nan"))
        ta.tree_attention(q, k_cache, v_cache, slots, lens_t, meta.words, gate=gate, num_splits=splits, out=out,
                          launch=ta.AttentionLaunch(block_m=32, block_n=16, tree_slack=tree_slack))
        np.testing.assert_allclose(out.double().cpu().numpy(), expected, rtol=2e-5, atol=2e-6, err_msg=str(splits))


@pytest.mark.parametrize("HQ", [4, 8], ids=["decode-sized", "tree-sized"])
def test_tree_attention_many_splits_merge_in_chunks(HQ, monkeypatch):
    """More splits than the combine merges at once (16): three chunks, most splits without keys. With more than 16
    rows per kv head (tree-sized, G N > 16) those splits store nothing and the combine must not read them: the
    split scratch is allocated NaN-filled here, so a read of an unwritten partial poisons the output."""
    empty = torch.empty

    def poisoned(*shape, **kw):
        t = empty(*shape, **kw)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", poisoned)
    rng = np.random.default_rng(8)
    rows = [build_tree_parents("random", 5, rng), build_tree_parents("chain", 5, rng)]
    for lens in ([70, 3], [0, 17]):
        q, gate, k_cache, v_cache, slots, lens_t = _make_batch(rng, rows, lens, HQ, 2, 16, torch.float32)
        meta = tree_metadata(_batch_parents(rows))
        out = torch.full_like(q, float("nan"))
        ta.tree_attention(q, k_cache, v_cache, slots, lens_t, meta.words, gate=gate, num_splits=37, out=out,
                          launch=ta.AttentionLaunch(block_n=16))
        expected = _reference_output(q, gate, k_cache, v_cache, slots, lens, rows)
        np.testing.assert_allclose(out.double().cpu().numpy(), expected, rtol=2e-5, atol=2e-6)


def test_tree_attention_pdl_request_gives_the_reference_output():
    """``pdl=True``: the reference output, tree-sized (empty splits skipped) and decode-sized (where PDL is
    unsupported, the interpreter or a GPU before sm_90, the plain launch: the prefetch's inline PTX is never traced
    there)."""
    rng = np.random.default_rng(12)
    for rows, HQ in (([build_tree_parents("random", 9, rng)], 8), ([[-1], [-1]], 4)):
        lens = [21] * len(rows)
        q, gate, k_cache, v_cache, slots, lens_t = _make_batch(rng, rows, lens, HQ, 2, 16, torch.float32)
        meta = tree_metadata(_batch_parents(rows))
        out = torch.full_like(q, float("nan"))
        ta.tree_attention(q, k_cache, v_cache, slots, lens_t, meta.words, gate=gate, num_splits=6, out=out,
                          launch=ta.AttentionLaunch(block_n=16), pdl=True)
        expected = _reference_output(q, gate, k_cache, v_cache, slots, lens, rows)
        np.testing.assert_allclose(out.double().cpu().numpy(), expected, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("block_n", [32, 64])
def test_tree_attention_without_gate_and_wide_tree_words(block_n):
    """N > 32 uses two ancestor words per node (a 64-key tile spans both); no gate returns the plain attention."""
    rng = np.random.default_rng(3)
    rows = [build_tree_parents("deep_wide", 40, rng)]
    q, _, k_cache, v_cache, slots, lens_t = _make_batch(rng, rows, [9], 2, 1, 16, torch.float32)
    meta = tree_metadata(_batch_parents(rows))
    out = ta.tree_attention(q, k_cache, v_cache, slots, lens_t, meta.words, num_splits=2,
                            launch=ta.AttentionLaunch(block_n=block_n))
    ones = torch.full_like(q, 80.0)  # sigmoid(80) == 1 in float64
    expected = _reference_output(q, ones, k_cache, v_cache, slots, [9], rows)
    np.testing.assert_allclose(out.double().cpu().numpy(), expected, rtol=2e-5, atol=2e-6)


def test_tree_attention_validates_inputs():
    rng = np.random.default_rng(0)
    rows = [build_tree_parents("random", 5, rng)] * 2
    q, gate, k_cache, v_cache, slots, lens_t = _make_batch(rng, rows, [3, 4], 4, 2, 16, torch.float32)
    words = tree_metadata(_batch_parents(rows)).words
    call = dict(gate=gate, num_splits=2)
    with pytest.raises(ValueError, match="q contains NaN"):
        bad = q.clone()
        bad[1, 2, 0, 3] = float("nan")
        ta.tree_attention(bad, k_cache, v_cache, slots, lens_t, words, **call)
    with pytest.raises(ValueError, match=r"slots\[1\]"):
        ta.tree_attention(q, k_cache, v_cache, torch.tensor([0, 99], dtype=torch.int32), lens_t, words, **call)
    with pytest.raises(ValueError, match="repeated"):
        ta.tree_attention(q, k_cache, v_cache, torch.tensor([1, 1], dtype=torch.int32), lens_t, words, **call)
    with pytest.raises(ValueError, match=r"cache_lens\[0\]"):
        ta.tree_attention(q, k_cache, v_cache, slots, torch.tensor([k_cache.shape[2], 0], dtype=torch.int32), words,
                          **call)
    with pytest.raises(ValueError, match="words"):
        ta.tree_attention(q, k_cache, v_cache, slots, lens_t, words[:, :3], **call)
    with pytest.raises(ValueError, match="gate"):
        ta.tree_attention(q, k_cache, v_cache, slots, lens_t, words, gate=gate[:, :, :2], num_splits=2)
    with pytest.raises(TypeError, match="dtype"):
        ta.tree_attention(q.double(), k_cache, v_cache, slots, lens_t, words, num_splits=2)
    with pytest.raises(ValueError, match="GQA"):
        ta.tree_attention(q[:, :, :3], k_cache, v_cache, slots, lens_t, words, num_splits=2)
    with pytest.raises(TypeError, match="slots"):
        ta.tree_attention(q, k_cache, v_cache, slots.long(), lens_t, words, num_splits=2)
    with pytest.raises(ValueError, match="block_n"):
        ta.tree_attention(q, k_cache, v_cache, slots, lens_t, words, num_splits=2,
                          launch=ta.AttentionLaunch(block_n=128))
    with pytest.raises(ValueError, match="tree_slack"):
        ta.tree_attention(q, k_cache, v_cache, slots, lens_t, words, num_splits=2,
                          launch=ta.AttentionLaunch(tree_slack=-1))
    with pytest.raises(ValueError, match="combine_block_d"):
        ta.tree_attention(q, k_cache, v_cache, slots, lens_t, words, num_splits=2,
                          launch=ta.AttentionLaunch(combine_block_d=24))


# ------------------------------------------------------------------------------------------------- kv commit
@settings(max_examples=12)
@given(tree_list=st.lists(trees(max_nodes=36), min_size=1, max_size=3), seed=st.integers(0, 2**31))
def test_kv_commit_matches_reference(tree_list, seed):
    rng = np.random.default_rng(seed)
    n = max(len(p) for p in tree_list)
    rows = [p + [int(rng.integers(0, len(p) + k)) for k in range(n - len(p))] for p in tree_list]
    lens = [int(x) for x in rng.integers(0, 9, len(rows))]
    _, _, k_cache, v_cache, slots, lens_t = _make_batch(rng, rows, lens, 2, 2, 16, torch.float32)
    accepted = [int(rng.integers(0, n)) for _ in rows]
    before_k, before_v = k_cache.clone(), v_cache.clone()
    meta = tree_metadata(_batch_parents(rows))
    ta.kv_commit(k_cache, v_cache, slots, lens_t, meta, torch.tensor(accepted, dtype=torch.int32, device=DEVICE))
    for b, parents in enumerate(rows):
        s, L = int(slots[b]), lens[b]
        kc, vc = (t[s].numpy().transpose(1, 0, 2) for t in (before_k, before_v))  # [C, HKV, D]
        exp_k, exp_v = ref_attn.kv_commit(kc[:L], vc[:L], kc[L : L + n], vc[L : L + n], TokenTree(parents),
                                          accepted[b])
        m = exp_k.shape[0]
        assert np.array_equal(k_cache[s, :, :m].numpy().transpose(1, 0, 2), exp_k)
        assert np.array_equal(v_cache[s, :, :m].numpy().transpose(1, 0, 2), exp_v)
    untouched = [p for p in range(k_cache.shape[0]) if p not in slots.tolist()]
    assert torch.equal(k_cache[untouched].nan_to_num(1.0), before_k[untouched].nan_to_num(1.0))


def test_kv_commit_layers_in_one_launch():
    """Caches ``[G, P, HKV, C, D]`` commit in one launch exactly as one launch per layer (random, chain longer than
    one 16-node chunk of the path, star, deep+wide; the accepted node anywhere)."""
    rng = np.random.default_rng(3)
    n = 40
    rows = [build_tree_parents(kind, n, rng) for kind in ("random", "chain", "star", "deep_wide")]
    lens = [0, 3, 7, 1]
    layers = [_make_batch(np.random.default_rng(10 + g), rows, lens, 2, 2, 16, torch.float32) for g in range(3)]
    slots, lens_t = layers[0][4], layers[0][5]
    k_stack = torch.stack([lay[2] for lay in layers])  # [G, P, HKV, C, D]
    v_stack = torch.stack([lay[3] for lay in layers])
    meta = tree_metadata(_batch_parents(rows))
    accepted = torch.tensor([n - 1, n - 1, 5, 30], dtype=torch.int32, device=DEVICE)
    ta.kv_commit(k_stack, v_stack, slots, lens_t, meta, accepted)
    for g, lay in enumerate(layers):
        k_cache, v_cache = lay[2].clone(), lay[3].clone()
        ta.kv_commit(k_cache, v_cache, slots, lens_t, meta, accepted)
        assert torch.equal(k_stack[g].nan_to_num(7.0), k_cache.nan_to_num(7.0))
        assert torch.equal(v_stack[g].nan_to_num(7.0), v_cache.nan_to_num(7.0))
    with pytest.raises(ValueError, match="v_cache"):
        ta.kv_commit(k_stack, v_stack[:2], slots, lens_t, meta, accepted)


def test_kv_commit_validates_accepted():
    rng = np.random.default_rng(1)
    rows = [build_tree_parents("random", 4, rng)]
    _, _, k_cache, v_cache, slots, lens_t = _make_batch(rng, rows, [2], 2, 1, 16, torch.float32)
    meta = tree_metadata(_batch_parents(rows))
    with pytest.raises(ValueError, match=r"accepted\[0\] = 4"):
        ta.kv_commit(k_cache, v_cache, slots, lens_t, meta, torch.tensor([4], dtype=torch.int32))


# ------------------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("B,N,L", [(1, 64, 8000), (3, 17, 1000), (4, 128, 333), (2, 1, 4097), (2, 8, 0)])
def test_gpu_bf16_qwen3_next_shapes_against_float64(B, N, L):
    """bf16 inputs, Qwen3-Next attention shapes: relative error against float64 on the same inputs <= 1e-2."""
    rng = np.random.default_rng(B * 1000 + N)
    torch.manual_seed(N)
    rows = [build_tree_parents("random", N, rng) for _ in range(B)]
    lens = [max(0, L - 7 * b) for b in range(B)]
    q, gate, k_cache, v_cache, slots, lens_t = _make_batch(rng, rows, lens, 16, 2, 256, torch.bfloat16)
    meta = tree_metadata(_batch_parents(rows))
    for splits in (None, 1):
        out = torch.full_like(q, float("nan"))
        ta.tree_attention(q, k_cache, v_cache, slots, lens_t, meta.words, gate=gate, out=out, num_splits=splits)
        expected = _reference_output(q, gate, k_cache, v_cache, slots, lens, rows)
        got = out.double().cpu().numpy()
        assert not np.isnan(got).any()
        rel = np.linalg.norm(got - expected) / np.linalg.norm(expected)
        assert rel < 1e-2, rel


@pytest.mark.gpu
@pytest.mark.parametrize("B,N,L", [(1, 64, 1024), (1, 1, 5000), (3, 8, 700)])
def test_gpu_pdl_attention_after_prepare_qkv_bit_identical(B, N, L):
    """``tree_attention(pdl=True)`` right after :func:`prepare_qkv` (which signals at its start, so the attention's
    programs prefetch the committed K / V while it still writes q and the tree's K / V): bit-identical to the plain
    launch, eagerly and in CUDA-graph replays with new q / k / v between them; the decode shape (N = 1) too."""
    rng = np.random.default_rng(B * 100 + N)
    rows = [build_tree_parents("random", N, rng) for _ in range(B)]
    lens = [max(0, L - 5 * b) for b in range(B)]
    _, gate, k_cache, v_cache, slots, lens_t = _make_batch(rng, rows, lens, 16, 2, 256, torch.bfloat16)
    meta = tree_metadata(_batch_parents(rows))
    q_raw = torch.randn(B, N, 16, 256, device="cuda").to(torch.bfloat16)
    k = torch.randn(B, N, 2, 256, device="cuda").to(torch.bfloat16)
    v = torch.randn(B, N, 2, 256, device="cuda").to(torch.bfloat16)
    qw, kw = torch.randn(256, device="cuda") * 0.3, torch.randn(256, device="cuda") * 0.3
    inv_freq = ta.rope_inv_freq(64, 10000.0, "cuda")
    splits = ta.default_launch(B, N, 16, 2, 256, max(lens) + N + 3, torch.device("cuda"))[4]

    def layer(pdl):
        q_rot = ta.prepare_qkv(q_raw, k, v, qw, kw, inv_freq, meta.depth, k_cache, v_cache, slots, lens_t,
                               validate=False)
        return ta.tree_attention(q_rot, k_cache, v_cache, slots, lens_t, meta.words, gate=gate, num_splits=splits,
                                 validate=False, pdl=pdl)

    plain = layer(False).clone()
    assert torch.equal(layer(True), plain)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(True)
    for scale in (0.5, 2.0):  # q, k, v halved, then back
        for t in (q_raw, k, v):
            t.mul_(scale)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, layer(False))
        assert torch.equal(out, plain) == (scale == 2.0)
