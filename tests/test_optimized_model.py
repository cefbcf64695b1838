"""The optimized hybrid model (lumotree.optimized.model) against the exact reference model (and transformers).

CPU: the Triton interpreter in float32 on tiny configs; logits must match the float64 reference to 1e-4 (absolute, on
logits of size ~3), KV/GDN/conv pools must follow the accepted paths. GPU (``pytest -m gpu``): bf16 against the
float64 reference built from the same bf16-rounded weights, and CUDA-graph replays against eager runs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lumotree.optimized import model as om
from lumotree.optimized.model import layers as layers_module
from lumotree.optimized.model import model as model_module
from lumotree.optimized.model.kernels import step_prologue
from lumotree.optimized.ops.tree_meta import tree_metadata
from lumotree.reference import model as rm
from lumotree.reference.config import HybridConfig
from lumotree.reference.tree import TokenTree

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            layer_types=("linear_attention", "full_attention"), num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16,
            linear_num_key_heads=2, linear_num_value_heads=4, num_experts=0, rope_theta=1000.0)
ATOL = 1e-4  # float32 kernels against float64, logits of magnitude ~3


def _slots(*s: int) -> torch.Tensor:
    return torch.tensor(s, dtype=torch.int32)


@pytest.fixture(scope="module")
def tiny():
    ref = rm.build_random(HybridConfig(**TINY), seed=1)
    return ref, om.from_reference(ref, num_slots=4, max_seq_len=48, max_nodes=16, graphs=False)


def test_prefill_verify_commit_decode_match_reference(tiny):
    """Two requests in one batch (different trees, one padded via num_nodes): every step equals the reference."""
    ref, opt = tiny
    prompts = {2: [3, 5, 7, 11, 13, 2, 9], 0: [1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6]}  # 2 chunks
    caches = {}
    for slot, prompt in prompts.items():
        caches[slot] = ref.new_cache()
        expected = ref.forward(prompt, caches[slot])[-1]
        got = opt.prefill(slot, prompt)
        np.testing.assert_allclose(got.numpy(), expected, atol=ATOL)
        assert opt.cache_length(slot) == len(prompt)
    trees = {2: TokenTree([-1, 0, 0, 1, 3, 2], [4, 8, 9, 10, 12, 1]), 0: TokenTree([-1, 0, 1, 1], [7, 3, 30, 31])}
    N = 6
    tokens = torch.zeros(2, N, dtype=torch.int64)
    parents = torch.zeros(2, N, dtype=torch.int32)
    for b, slot in enumerate((2, 0)):
        n = trees[slot].num_nodes
        tokens[b, :n] = torch.tensor(trees[slot].tokens)
        parents[b, :n] = torch.tensor(trees[slot].parents)
        parents[b, n:] = 0  # padding, ignored
    logits = opt.verify(_slots(2, 0), tokens, parents, torch.tensor([6, 4], dtype=torch.int32))
    for b, slot in enumerate((2, 0)):
        tree = trees[slot]
        expected = ref.verify_tree(list(tree.tokens), tree, caches[slot])
        np.testing.assert_allclose(logits[b, : tree.num_nodes].numpy(), expected, atol=ATOL)
    accepted = {2: 4, 0: 3}
    opt.commit(_slots(2, 0), torch.tensor([accepted[2], accepted[0]], dtype=torch.int32))
    for slot in (2, 0):
        tree = trees[slot]
        ref.commit(list(tree.tokens), tree, accepted[slot], caches[slot])
        assert opt.cache_length(slot) == caches[slot].length
    got = opt.decode(_slots(0, 2), torch.tensor([17, 23]))
    for b, (slot, tok) in enumerate(((0, 17), (2, 23))):
        np.testing.assert_allclose(got[b].numpy(), ref.forward([tok], caches[slot])[-1], atol=ATOL)


def test_verify_commit_then_decode_equals_plain_decode(tiny):
    """Committing an accepted path and decoding equals decoding the path's tokens one by one (another slot)."""
    _, opt = tiny
    prompt = [5, 6, 7, 8, 9]
    tree = TokenTree([-1, 0, 1, 0, 2, 4], [11, 12, 13, 14, 15, 16])
    opt.prefill(1, prompt)
    opt.prefill(3, prompt)
    opt.verify(_slots(1), torch.tensor([tree.tokens]), torch.tensor([tree.parents]))
    opt.commit(_slots(1), torch.tensor([3], dtype=torch.int32))  # path 0 -> 3: node 3's K/V move to position 1
    after_tree = opt.decode(_slots(1), torch.tensor([40]))
    for tok in [tree.tokens[j] for j in tree.path(3)]:
        opt.decode(_slots(3), torch.tensor([tok]))
    plain = opt.decode(_slots(3), torch.tensor([40]))
    assert opt.cache_length(1) == opt.cache_length(3) == len(prompt) + 3
    np.testing.assert_allclose(after_tree.numpy(), plain.numpy(), atol=1e-5)
    for pool in (*opt.caches.state_pools, *opt.caches.conv_pools):  # the two slots hold the same GDN and conv states
        np.testing.assert_allclose(pool[1].numpy(), pool[3].numpy(), atol=1e-5)
    L = opt.cache_length(1)
    k_pool = opt.caches.k_pools[0]
    np.testing.assert_allclose(k_pool[1, :, :L].numpy(), k_pool[3, :, :L].numpy(), atol=1e-5)


def test_commit_is_one_launch_per_kind_of_cache_for_all_layers(monkeypatch):
    """Five layers (three GDN, two attention, interleaved): a commit launches one GDN state, one conv state and one
    KV commit for all layers, and committing a path then decoding equals decoding the path's tokens one by one, in
    every layer's pools."""
    kinds = ("linear_attention", "linear_attention", "full_attention", "linear_attention", "full_attention")
    ref = rm.build_random(HybridConfig(**{**TINY, "num_hidden_layers": 5, "layer_types": kinds}), seed=2)
    opt = om.from_reference(ref, num_slots=4, max_seq_len=48, max_nodes=16, graphs=False)
    calls = []
    for name in ("gdn_tree_commit", "tree_conv_commit", "kv_commit"):  # the commit's calls, counted where it makes them
        real = getattr(model_module, name)
        monkeypatch.setattr(model_module, name,
                            lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    prompt = [5, 6, 7, 8, 9]
    tree = TokenTree([-1, 0, 1, 0, 2, 4, 3], [11, 12, 13, 14, 15, 16, 17])
    opt.prefill(0, prompt)
    opt.prefill(2, prompt)
    calls.clear()
    opt.verify(_slots(0), torch.tensor([tree.tokens]), torch.tensor([tree.parents]))
    opt.commit(_slots(0), torch.tensor([5], dtype=torch.int32))  # path 0 -> 1 -> 2 -> 4 -> 5
    assert sorted(calls) == ["gdn_tree_commit", "kv_commit", "tree_conv_commit"]
    for tok in [tree.tokens[j] for j in tree.path(5)]:
        opt.decode(_slots(2), torch.tensor([tok]))
    assert opt.cache_length(0) == opt.cache_length(2) == len(prompt) + 5
    for pool in (*opt.caches.state_pools, *opt.caches.conv_pools):
        np.testing.assert_allclose(pool[0].numpy(), pool[2].numpy(), atol=1e-5)
    L = opt.cache_length(0)
    for pool in (*opt.caches.k_pools, *opt.caches.v_pools):
        np.testing.assert_allclose(pool[0, :, :L].numpy(), pool[2, :, :L].numpy(), atol=1e-5)
    np.testing.assert_allclose(opt.decode(_slots(0), torch.tensor([40])).numpy(),
                               opt.decode(_slots(2), torch.tensor([40])).numpy(), atol=1e-5)


def test_speculate_greedy_equals_verify_accept_commit(monkeypatch):
    """The fused greedy step (verify + greedy acceptance + commit, one call) equals the three calls: the same outcome
    (accepted node, depth, next token, path) and the same caches afterwards, on trees whose tokens follow the
    target's argmax along a designed path (so acceptance goes deep), one tree padded via num_nodes; the LM head's
    argmax taken 3 rows at a time (HEAD_ROWS) covers the chunked head."""
    from lumotree.optimized.engine.sampling import TreeBatch, VerifyOutcome, verify_greedy

    monkeypatch.setattr(om, "HEAD_ROWS", 3)

    ref = rm.build_random(HybridConfig(**TINY), seed=3)
    opt = om.from_reference(ref, num_slots=4, max_seq_len=48, max_nodes=16, graphs=False)
    prompts = ([3, 1, 4, 1, 5], [2, 7, 1, 8, 2, 8, 1])
    for pair, prompt in enumerate(prompts):  # slots (0, 2) and (1, 3) hold the same prompts
        opt.prefill(pair, prompt)
        opt.prefill(pair + 2, prompt)
    parents = torch.tensor([[-1, 0, 1, 0, 2, 4, 3, 5], [-1, 0, 0, 1, 2, 0, 0, 0]], dtype=torch.int32)  # [2, 8]
    num_nodes = torch.tensor([8, 5], dtype=torch.int32)
    tokens = torch.tensor([[9, 20, 21, 22, 23, 24, 25, 26], [6, 30, 31, 32, 33, 0, 0, 0]])  # [2, 8]
    designed = [[1, 2, 4, 5, 7], [2, 4]]  # nodes that take their parent's argmax (the first tree's path 0-1-2-4-5-7)
    for b, path in enumerate(designed):
        for node in path:  # verify does not touch the caches: fix one node at a time, top-down
            argmax = opt.verify(_slots(0, 1), tokens, parents, num_nodes).argmax(-1)
            tokens[b, node] = argmax[b, int(parents[b, node])]
    tokens[0, 3] = (tokens[0, 1] + 1) % TINY["vocab_size"]  # siblings distinct
    logits = opt.verify(_slots(0, 1), tokens, parents, num_nodes)
    expected = verify_greedy(TreeBatch(tokens, parents.long(), num_nodes.long()), logits.argmax(-1))
    opt.commit(_slots(0, 1), expected.accepted_node.to(torch.int32))
    got = VerifyOutcome.from_packed(opt.speculate_greedy(_slots(2, 3), tokens, parents, num_nodes))
    assert expected.accepted_len.tolist()[0] == 5  # the designed path was accepted whole
    for name in ("accepted_node", "accepted_len", "next_token", "on_path"):
        assert torch.equal(getattr(got, name).long(), getattr(expected, name).long()), name
    for pair in (0, 1):
        assert opt.cache_length(pair) == opt.cache_length(pair + 2)
        for pool in (*opt.caches.state_pools, *opt.caches.conv_pools):
            np.testing.assert_allclose(pool[pair].numpy(), pool[pair + 2].numpy(), atol=1e-6)
        L = opt.cache_length(pair)
        k_pool = opt.caches.k_pools[0]
        np.testing.assert_allclose(k_pool[pair, :, :L].numpy(), k_pool[pair + 2, :, :L].numpy(),
                                   atol=1e-6)
    with pytest.raises(ValueError, match="num_nodes"):
        opt.speculate_greedy(_slots(2, 3), tokens, parents, torch.tensor([9, 5], dtype=torch.int32))


def test_small_batch_linear_decode_matches_reference(tiny):
    """Decode with the projections on ops.gemv (split-K GEMV) equals the reference model; verify (more than 8
    rows) keeps cuBLAS."""
    ref, _ = tiny
    opt = om.from_reference(ref, num_slots=2, max_seq_len=48, max_nodes=16, graphs=False, small_batch_linear=True)
    prompt = [2, 7, 1, 8, 2, 8]
    cache = ref.new_cache()
    ref.forward(prompt, cache)
    opt.prefill(1, prompt)
    for tok in (31, 4, 15):
        got = opt.decode(_slots(1), torch.tensor([tok]))
        np.testing.assert_allclose(got[0].numpy(), ref.forward([tok], cache)[-1], atol=ATOL)


def test_fused_norms_keep_two_norm_launches_and_the_same_logits(tiny, monkeypatch):
    """With the GEMVs fusing the residual add + RMSNorm between projections (``fused_norms``), a decode step launches
    the add + RMSNorm kernel only for the first layer's input and the final norm (instead of 1 + 2 per layer), and a
    small tree step (at most 8 rows: on the GEMV) the same; the decode's conv step runs in the GEMV's epilogue
    either way (no conv_step launch on the GEMV, one per GDN layer on cuBLAS); the tree step's gated RMSNorm after
    each GDN layer is split between the verify kernel and ``w_out`` with fused norms (no gated_rmsnorm launch;
    one per GDN layer otherwise); logits equal the unfused model's, cuBLAS's and the reference's."""
    ref, _ = tiny
    opt = om.from_reference(ref, num_slots=2, max_seq_len=48, max_nodes=16, graphs=False, small_batch_linear=True)
    calls, conv_calls, gate_calls = [], [], []
    real, real_conv, real_gate = layers_module.add_rmsnorm, layers_module.conv_step, layers_module.gated_rmsnorm
    monkeypatch.setattr(layers_module, "add_rmsnorm", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(layers_module, "conv_step", lambda *a, **k: conv_calls.append(1) or real_conv(*a, **k))
    monkeypatch.setattr(layers_module, "gated_rmsnorm", lambda *a, **k: gate_calls.append(1) or real_gate(*a, **k))
    prompt = [2, 7, 1, 8, 2, 8]
    tree_tokens, tree_parents = torch.tensor([[5, 9, 3, 11]]), torch.tensor([[-1, 0, 0, 1]], dtype=torch.int32)
    results = {}
    for gemv, fused in ((True, True), (True, False), (False, False)):
        opt.set_small_batch_linear(gemv, fused_norms=fused)
        opt.prefill(0, prompt)
        calls.clear()
        conv_calls.clear()
        decoded = opt.decode(_slots(0), torch.tensor([31]))[0].clone()
        decode_calls, decode_convs = len(calls), len(conv_calls)
        calls.clear()
        gate_calls.clear()
        tree = opt.verify(_slots(0), tree_tokens, tree_parents)[0].clone()
        results[gemv, fused] = (decoded, tree, decode_calls, len(calls), decode_convs, len(gate_calls))
    layers = len(opt.weights.layers)
    gdn_layers = len(opt.caches.conv_pools)
    assert results[True, True][2:] == (2, 2, 0, 0)
    assert results[True, False][2:] == (1 + 2 * layers, 1 + 2 * layers, 0, gdn_layers)
    assert results[False, False][2:] == (1 + 2 * layers, 1 + 2 * layers, gdn_layers, gdn_layers)
    for other in ((True, False), (False, False)):
        for i in (0, 1):
            np.testing.assert_allclose(results[True, True][i].numpy(), results[other][i].numpy(), atol=1e-5)
    results = {fused: results[True, fused] for fused in (True, False)}
    cache = ref.new_cache()
    ref.forward(prompt, cache)
    np.testing.assert_allclose(results[True][0].numpy(), ref.forward([31], cache)[-1], atol=ATOL)


def test_step_prologue_gathers_embeddings_and_reads_or_advances_the_lengths():
    """The step prologue kernel on strided int64 inputs (the columns of a ``[B, 2]`` decode step input, a strided
    ``[B, N]`` token block of a tree step): the embedding rows of the tokens in row order, the slots as contiguous
    int32, each slot's length before the step, (decode only) the lengths advanced by one at those slots only, and
    (tree steps) the tree metadata of :func:`tree_metadata` bit for bit, a padded tree among them."""
    gen = torch.Generator().manual_seed(3)
    embed = torch.randn(11, 40, generator=gen)  # [Vocab, Dm] (Dm not a power of two)
    lens = torch.tensor([5, 0, 9, 2, 7], dtype=torch.int32)  # [P]
    step_in = torch.tensor([[10, 3], [0, 0], [4, 2]], dtype=torch.int64)  # [B, 2] tokens | slots
    before = lens.clone()
    h, slots, got_lens, meta = step_prologue(step_in[:, 0], step_in[:, 1], embed, lens, True)
    assert meta is None
    assert torch.equal(h, embed[[10, 0, 4]])
    assert slots.dtype == torch.int32 and slots.is_contiguous() and slots.tolist() == [3, 0, 2]
    assert got_lens.tolist() == [before[3], before[0], before[2]]
    expected = before.clone()
    expected[[3, 0, 2]] += 1
    assert torch.equal(lens, expected)
    tokens = torch.tensor([[1, 9, 9, 2, 9, 9, 3], [4, 9, 9, 5, 9, 9, 6]])[:, ::3]  # [B, N] = [2, 3] stride 3
    before = lens.clone()
    parents = torch.tensor([[-1, 9, 0, 9, 0, 9], [-1, 9, 0, 9, 5, 9]])[:, ::2]  # [B, N] = [2, 3] stride 2
    num_nodes = torch.tensor([3, 2], dtype=torch.int32)  # request 1: node 2 is padding (its parent is not read)
    h, slots, got_lens, meta = step_prologue(tokens, torch.tensor([4, 1]), embed, lens, False,
                                                 (parents, num_nodes))
    assert torch.equal(h, embed[[1, 2, 3, 4, 5, 6]]) and slots.tolist() == [4, 1]
    assert got_lens.tolist() == [before[4], before[1]] and torch.equal(lens, before)
    want = tree_metadata(parents, num_nodes=num_nodes)
    assert torch.equal(meta.words, want.words) and torch.equal(meta.depth, want.depth)
    assert meta.depth.tolist() == [[0, 1, 1], [0, 1, 2]] and meta.words[1, :, 0].tolist() == [1, 3, 7]


def test_moe_model_and_checkpoint_round_trip_match_reference_and_transformers(tmp_path):
    """MoE layers (top-2 of 4 experts, shared expert); loaded from a HF checkpoint; also against transformers."""
    config = HybridConfig(**{**TINY, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
                             "shared_expert_intermediate_size": 16, "decoder_sparse_step": 2})
    ref = rm.build_random(config, seed=3)
    rm.save_pretrained(ref, tmp_path, dtype="float32")
    opt = om.load_pretrained(tmp_path, num_slots=2, max_seq_len=32, max_nodes=8, graphs=False)
    prompt = [9, 8, 7, 6, 5, 4]
    ref32 = rm.load_pretrained(tmp_path)  # the float32-rounded weights, in float64
    cache = ref32.new_cache()
    expected = ref32.forward(prompt, cache)
    np.testing.assert_allclose(opt.prefill(0, prompt).numpy(), expected[-1], atol=ATOL)

    from transformers import Qwen3NextForCausalLM

    hf = Qwen3NextForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()  # its MoE needs fp32
    with torch.no_grad():
        hf_logits = hf(torch.tensor([prompt])).logits[0, -1].numpy()
    np.testing.assert_allclose(opt.prefill(1, prompt).numpy(), hf_logits, atol=2 * ATOL)


def test_validation_errors(tiny):
    _, opt = tiny
    opt.prefill(0, [1, 2, 3])
    tree_tokens, tree_parents = torch.tensor([[1, 2, 3]]), torch.tensor([[-1, 0, 0]])
    with pytest.raises(ValueError, match="slot"):
        opt.prefill(9, [1, 2])
    with pytest.raises(ValueError, match="vocabulary"):
        opt.decode(_slots(0), torch.tensor([64]))
    with pytest.raises(ValueError, match="repeated"):
        opt.decode(_slots(0, 0), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"parents\[0\]\[2\]|parents\[0\]"):
        opt.verify(_slots(0), tree_tokens, torch.tensor([[-1, 0, 2]]))
    with pytest.raises(ValueError, match="N = 17"):
        opt.verify(_slots(0), torch.zeros(1, 17, dtype=torch.int64), torch.zeros(1, 17, dtype=torch.int32))
    with pytest.raises(RuntimeError, match="verify"):
        opt.commit(_slots(0), torch.tensor([0], dtype=torch.int32))
    opt.verify(_slots(0), tree_tokens, tree_parents)
    with pytest.raises(ValueError, match=r"accepted\[0\] = 3"):
        opt.commit(_slots(0), torch.tensor([3], dtype=torch.int32))
    with pytest.raises(ValueError, match="differ"):
        opt.commit(_slots(1), torch.tensor([0], dtype=torch.int32))
    tensors = rm.weights_to_tensors(rm.build_random(HybridConfig(**TINY), seed=0).weights, HybridConfig(**TINY))
    with pytest.raises(ValueError, match="unexpected tensor 'extra'"):
        om.OptimizedModel(HybridConfig(**TINY), {**tensors, "extra": np.zeros(1)}, graphs=False)
    missing = dict(tensors)
    missing.pop("model.norm.weight")
    with pytest.raises(ValueError, match="missing tensor 'model.norm.weight'"):
        om.OptimizedModel(HybridConfig(**TINY), missing, graphs=False)
    with pytest.raises(ValueError, match="max_nodes"):
        om.OptimizedModel(HybridConfig(**TINY), tensors, max_nodes=500, graphs=False)


# ------------------------------------------------------------------------------------------------------- GPU
GPU_CFG = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=16,
               num_key_value_heads=2, head_dim=256, linear_key_head_dim=128, linear_value_head_dim=128,
               linear_num_key_heads=4, linear_num_value_heads=8, num_experts=0)


def _bf16_reference(config: HybridConfig, seed: int):
    """A reference model whose float64 weights are exactly the bf16-rounded ones the GPU model uses."""
    ref = rm.build_random(config, seed=seed)
    tensors = {k: torch.from_numpy(v).to(torch.bfloat16).double().numpy()
               for k, v in rm.weights_to_tensors(ref.weights, config).items()}
    return rm.HybridModel(config, rm.weights_from_tensors(tensors, config)), tensors


@pytest.mark.gpu
def test_gpu_bf16_model_against_float64_reference():
    """bf16 activations: relative L2 error of logits <= 3e-2 for prefill, a 24-node verify, and decode."""
    config = HybridConfig(**GPU_CFG)
    ref, tensors = _bf16_reference(config, seed=5)
    opt = om.OptimizedModel(config, tensors, num_slots=2, max_seq_len=256, max_nodes=32, graphs=False)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 512, 70).tolist()
    cache = ref.new_cache()

    def rel(a, b):
        return float(np.linalg.norm(a - b) / np.linalg.norm(b))

    assert rel(opt.prefill(1, prompt).cpu().double().numpy(), ref.forward(prompt, cache)[-1]) < 3e-2
    parents = [-1] + [int(rng.integers(0, i)) for i in range(1, 24)]
    tree = TokenTree(parents, [int(t) for t in rng.integers(0, 512, 24)])
    got = opt.verify(_slots(1).cuda(), torch.tensor([tree.tokens]).cuda(), torch.tensor([tree.parents]).cuda())
    assert rel(got[0].cpu().double().numpy(), ref.verify_tree(list(tree.tokens), tree, cache)) < 3e-2
    node = tree.leaves[-1]
    opt.commit(_slots(1).cuda(), torch.tensor([node], dtype=torch.int32).cuda())
    ref.commit(list(tree.tokens), tree, node, cache)
    got = opt.decode(_slots(1).cuda(), torch.tensor([7]).cuda())
    assert rel(got[0].cpu().double().numpy(), ref.forward([7], cache)[-1]) < 3e-2


@pytest.mark.gpu
def test_gpu_graph_replay_equals_eager():
    """CUDA-graph replays (second call of a shape onwards) give the eager results for verify, commit, decode and the
    fused greedy step (its outcome and the logits of a verify after it)."""
    config = HybridConfig(**GPU_CFG)
    tensors = {k: torch.from_numpy(v) for k, v in rm.weights_to_tensors(rm.build_random(config, seed=2).weights,
                                                                          config).items()}
    models = [om.OptimizedModel(config, tensors, num_slots=4, max_seq_len=256, max_nodes=16, graphs=g)
              for g in (False, True)]
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 512, 20 + 9 * b).tolist() for b in range(3)]
    steps = [(torch.tensor([[-1] + [int(rng.integers(0, i)) for i in range(1, 16)] for _ in range(3)]).cuda(),
              torch.tensor(rng.integers(0, 512, (3, 16))).cuda()) for _ in range(3)]
    slots = _slots(3, 0, 2).cuda()
    outs = []
    for m in models:
        for s, p in zip(slots.tolist(), prompts):
            m.prefill(s, p)
        seq = []
        for parents, tokens in steps:  # step 0 runs eagerly and captures, steps 1-2 replay
            seq.append(m.verify(slots, tokens, parents).clone())
            m.commit(slots, torch.tensor([15, 0, 7], dtype=torch.int32).cuda())
            seq.append(m.decode(slots, torch.tensor([1, 2, 3]).cuda()).clone())
        for parents, tokens in steps:  # the fused greedy step: eager and capture, then replays
            tokens = tokens.clone()
            tokens[:, 1] = m.verify(slots, tokens, parents)[:, 0].argmax(-1)  # node 1 (the root's child) is accepted
            packed = m.speculate_greedy(slots, tokens, parents).clone()
            assert (packed[:, 1] >= 1).all()
            seq.append(packed)
            seq.append(m.verify(slots, tokens, parents).clone())
            m.commit(slots, torch.zeros(3, dtype=torch.int32).cuda())
        outs.append(seq)
    for eager, graph in zip(*outs):
        if eager.dtype == torch.int64:  # a greedy outcome: equal up to near-ties of bf16 logits, here none
            assert torch.equal(graph, eager)
        else:
            torch.testing.assert_close(graph, eager, rtol=1e-2, atol=1e-2)



@pytest.mark.gpu
def test_gpu_deferred_commits_equal_in_place_commits():
    """On sm_90, tree steps of 64 nodes at a batch of 8 run fused with deferred commits; the same steps committed in
    place give the same greedy outcomes, and after a flush the same states (to the kernels' tf32 rounding). Decode
    steps between them flush first. A greedy-stable random model (the benchmark's weights) keeps bf16 rounding away
    from the argmax."""
    from lumotree.optimized.model import random_tensors, successor_permutation
    from lumotree.optimized.ops.gdn_tree.fused import fused_verify_supported

    if not fused_verify_supported("cuda"):
        pytest.skip("the fused GDN verify runs on sm_90 only")
    config = HybridConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=64, linear_key_head_dim=128,
                          linear_value_head_dim=128, linear_num_key_heads=2, linear_num_value_heads=4, num_experts=0)
    tensors = random_tensors(config, 3, "cuda", torch.bfloat16, successor=True)
    successor = successor_permutation(config.vocab_size, 3)
    models = {flag: om.OptimizedModel(config, tensors, num_slots=8, max_seq_len=256, max_nodes=64,
                                      deferred_commits=flag) for flag in (True, False)}
    assert models[True].deferred_commits and not models[False].deferred_commits
    rng = np.random.default_rng(0)
    B, N = 8, 64
    slots = torch.arange(B, dtype=torch.int32)
    prompts = [rng.integers(0, config.vocab_size, 12).tolist() for _ in range(B)]
    pending_tok = {}
    for flag, model in models.items():
        for b, prompt in enumerate(prompts):
            pending_tok[flag, b] = int(model.prefill(b, prompt).argmax())
    assert all(pending_tok[True, b] == pending_tok[False, b] for b in range(B))
    tok = [pending_tok[True, b] for b in range(B)]
    for step in range(3):
        parents = np.zeros((B, N), dtype=np.int32)
        tokens = np.zeros((B, N), dtype=np.int64)
        for b in range(B):
            parents[b] = [-1] + [int(rng.integers(max(0, i - 3), i)) for i in range(1, N)]
            tokens[b, 0] = tok[b]
            for i in range(1, N):  # half the children follow the model's greedy successor: long accepted paths
                parent_token = int(tokens[b, parents[b, i]])
                tokens[b, i] = int(successor[parent_token]) if rng.random() < 0.5 else int(rng.integers(512))
        outs = {}
        for flag, model in models.items():
            outs[flag] = model.speculate_greedy(slots, torch.from_numpy(tokens), torch.from_numpy(parents)).cpu()
        assert torch.equal(outs[True], outs[False]), step
        assert int(outs[True][:, 1].max()) >= 2  # paths of several nodes were accepted and recorded
        tok = outs[True][:, 2].tolist()
        if step == 1:  # a decode step in between: the deferred model flushes first
            logits = {flag: model.decode(slots, torch.tensor(tok)) for flag, model in models.items()}
            assert torch.equal(logits[True].argmax(-1), logits[False].argmax(-1))
            tok = logits[True].argmax(-1).tolist()
    models[True].caches.flush(list(range(B)))
    for a, b in zip(models[True].caches.state_pools, models[False].caches.state_pools):
        # the fused steps read the tree conv's outputs in fp32, the in-place ones in bf16: bf16's rounding apart
        assert float((a[:B] - b[:B]).norm() / b[:B].norm()) < 1e-2
