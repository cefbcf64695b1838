"""The MTP head and the MTP drafter.

- The reference head (float64): one call equals the same pairs in two calls, and a tree node equals the chain of its
  path (positions ``length + depth``).
- The optimized head (fp32, Triton interpreter) against the reference on checkpoints with ``mtp.*`` tensors written
  to disk and read by both loaders (a Qwen3-Next MoE model and a dense Qwen3.5 one): the target's hidden states after
  a prefill, a commit of a depth-2 node of a branching tree and a decode, and the head's logits and outputs.
- The drafter's drafts equal the head recomputed from scratch on the full context (the hidden-state bookkeeping of
  continuous batching), with valid structure: parents, confidences in (0, 1] never increasing down a path, sizes.
- Greedy chain and tree speculation with the drafter equal greedy autoregressive decoding (reference engine,
  optimized engine under the interpreter, ``lumotree generate``); on a model whose head drafts the target's own
  continuation every drafted token is accepted, so paths of every depth commit.
- Sampling stays lossless: sampled chains (chi-square against the exact autoregressive distribution; a verifier that
  resamples from the target after a rejection fails it) and top-k trees (the seeded text is the autoregressive one).
- Bad input: no MTP head, depth or top-k below 1, in the API and on the command line.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

from lumotree.cli import main
from lumotree.optimized.engine import Engine, MTPDrafter, OptimizedTarget, ReferenceTarget, SamplingParams
from lumotree.optimized.engine import sampling
from lumotree.optimized.engine.drafters import make_drafter
from lumotree.optimized.model import load_pretrained as load_optimized
from lumotree.optimized.model import from_reference, random_tensors
from lumotree.reference.config import HybridConfig
from lumotree.reference.model import HybridModel, build_random, load_pretrained, save_pretrained, weights_from_tensors
from lumotree.reference.mtp import MTPHead
from lumotree.reference.tree import TokenTree
from strategies import chi_square_pvalue

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            layer_types=("linear_attention", "full_attention"), num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
            linear_num_value_heads=4, rope_theta=1000.0, num_experts=0, mtp_num_hidden_layers=1)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24)
PARITY_BOUND = 1e-5  # max |fp32 interpreter - float64 reference| / max |reference|


pytestmark = pytest.mark.usefixtures("one_torch_thread_no_grad")  # conftest.py


def rel_error(got, want) -> float:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return float(np.abs(got - want).max() / np.abs(want).max())


def echo_model(config: HybridConfig, seed: int) -> HybridModel:
    """A model whose MTP head drafts the target's greedy continuation: the target is the successor random model
    (greedy next token of t is ``pi(t)``, ``random_tensors(successor=True)``) and ``mtp.fc = [I, 0.05 R]`` passes the
    next token's normed embedding on, so the head's argmax after token x is ``pi(x)`` too; the hidden half stays in."""
    tensors = {name: t.double().numpy() for name, t in random_tensors(config, seed, "cpu", successor=True).items()}
    D = config.hidden_size
    noise = np.random.default_rng(seed).standard_normal((D, D)) / np.sqrt(D)  # [D, D]
    tensors["mtp.fc.weight"] = np.concatenate([np.eye(D), 0.05 * noise], 1)  # [D, 2D]
    return HybridModel(config, weights_from_tensors(tensors, config))


@pytest.fixture(scope="module")
def random_model():
    return build_random(HybridConfig(**TINY), seed=1)


@pytest.fixture(scope="module")
def echo():
    return echo_model(HybridConfig(**TINY), seed=3)


class RecordingDrafter(MTPDrafter):
    """The MTP drafter keeping every draft with the context and limits it was proposed for."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[list[int], object, int, bool]] = []

    def propose(self, requests, max_nodes, chain):
        drafts = super().propose(requests, max_nodes, chain)
        self.seen += [(list(r.context), d, max_nodes, chain) for r, d in zip(requests, drafts)]
        return drafts


def generate(target, mode, prompts, params, max_nodes=8, drafter=None, **options):
    drafter = drafter if drafter is not None or mode == "autoregressive" else MTPDrafter(target, **options)
    engine = Engine(target, drafter, mode=mode, budget="fixed", max_nodes=max_nodes, seed=1)
    return engine.generate(prompts, params)


# ================================================================================================== reference head
def test_reference_head_calls_chain_and_trees_agree(random_model):
    """Pairs appended in one call or two give the same entries and logits; a tree node's logits are those of the
    chain of its path (node i at position length + depth(i))."""
    model = random_model
    head = MTPHead(model)
    rng = np.random.default_rng(0)
    hidden, tokens = rng.standard_normal((7, 32)), rng.integers(0, 64, 7).tolist()
    whole, split = head.new_cache(), head.new_cache()
    logits, g = head.forward(hidden, tokens, whole)
    first, _ = head.forward(hidden[:3], tokens[:3], split)
    second, g_second = head.forward(hidden[3:], tokens[3:], split)
    np.testing.assert_allclose(np.concatenate([first, second]), logits, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(g_second, g[3:], rtol=1e-12, atol=1e-12)
    assert whole.length == split.length == 7
    tree = TokenTree([-1, 0, 0, 2, 2, 4], rng.integers(0, 64, 6).tolist())
    tree_hidden = rng.standard_normal((6, 32))
    tree_logits, tree_g = head.tree(tree_hidden, tree.tokens, tree, whole)
    assert whole.length == 7  # untouched
    path = tree.path(5)  # 0, 2, 4, 5
    chain_logits, chain_g = head.forward(tree_hidden[path], [tree.tokens[i] for i in path], whole.copy())
    np.testing.assert_allclose(tree_logits[path], chain_logits, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(tree_g[path], chain_g, rtol=1e-12, atol=1e-12)


def test_the_training_models_head_is_the_reference_head(tmp_path):
    """An independent implementation of the head (:mod:`lumotree.training`'s autograd model, the head it trains
    jointly with the target): its teacher-forced logits on a sequence equal the reference head's on the checkpoint it
    saves, so the drafter reads a trained head under the convention it was trained with."""
    pytest.importorskip("safetensors")
    from lumotree.training.model import HybridLM, save_checkpoint

    config = HybridConfig(**TINY, model_type="qwen3_5_text", partial_rotary_factor=0.5)
    trained = HybridLM(config, backend="torch")
    trained.initialize(3, std=0.3)
    gen = torch.Generator().manual_seed(4)
    for name, p in trained.named_parameters():  # every norm off its identity, so that each one is checked
        if p.ndim == 1 and not name.endswith(("A_log", "dt_bias")):
            p.add_(0.2 * torch.randn(p.shape, generator=gen))
    save_checkpoint(trained, tmp_path, dtype=torch.float32)
    tokens = torch.randint(0, 64, (1, 12), generator=gen)  # [1, T]
    hidden = trained.hidden(tokens)  # [1, T, D]
    want = trained.logits(trained.mtp_hidden(hidden[:, :-1], tokens[:, 1:]))[0]  # [T - 1, V] over tokens 2 ..
    model = load_pretrained(tmp_path)
    _, ref_hidden = model.forward(tokens[0].tolist(), model.new_cache(), return_hidden=True)  # [T, D]
    head = MTPHead(model)
    logits, _ = head.forward(ref_hidden[:-1], tokens[0, 1:].tolist(), head.new_cache())
    assert rel_error(want.double().numpy(), logits) < 1e-5


# ================================================================================================== optimized head
@pytest.mark.parametrize("model_type, extra", [("qwen3_next", MOE), ("qwen3_5_text", {})])
def test_optimized_head_and_hidden_states_match_the_reference(tmp_path, model_type, extra):
    """A checkpoint with ``mtp.*`` tensors read by both loaders: the optimized target's hidden states (prefill, the
    commit of a depth-2 node of a branching tree, a decode) and its head's logits and outputs (the prompt's pairs
    appended, then a branching tree) equal the reference's within 1e-5 relative."""
    config = HybridConfig(**{**TINY, **extra}, model_type=model_type)
    save_pretrained(build_random(config, seed=5), tmp_path)
    ref = load_pretrained(tmp_path)
    assert ref.weights.mtp is not None and (ref.weights.mtp.layers[0].mlp.__class__.__name__ == "MoEWeights") == \
        bool(extra)
    opt = load_optimized(tmp_path, num_slots=2, max_seq_len=32, max_nodes=8, graphs=False, dtype=torch.float32)
    head, ref_head = opt.mtp_head(), MTPHead(ref)
    prompt = [5, 9, 2, 5, 9, 2, 7]
    cache = ref.new_cache()
    _, hidden = ref.forward(prompt, cache, return_hidden=True)  # [T, D]
    opt.prefill(1, prompt)
    assert rel_error(opt.hidden_states(1, len(prompt)).numpy(), hidden) < PARITY_BOUND
    # the head: the prompt's pairs, then a tree rooted at (h_{T-1}, pending token)
    head.reset(1)
    head.extend([1], [prompt[1:]], [opt.hidden_states(1, len(prompt))[:-1]])
    mtp_cache = ref_head.new_cache()
    ref_head.forward(hidden[:-1], prompt[1:], mtp_cache)
    tree = TokenTree([-1, 0, 0, 1, 2, 4], [11, 3, 4, 5, 6, 7])
    tree_hidden = np.random.default_rng(1).standard_normal((6, 32))
    tree_hidden[0] = hidden[-1]
    want_logits, want_g = ref_head.tree(tree_hidden, tree.tokens, tree, mtp_cache)
    N = 8
    tokens = torch.zeros((1, N), dtype=torch.int64)
    tokens[0, :6] = torch.tensor(tree.tokens)
    parents = (torch.arange(N, dtype=torch.int32) - 1)[None]
    parents[0, :6] = torch.tensor(tree.parents)
    padded = torch.zeros((1, N, 32))
    padded[0, :6] = torch.from_numpy(tree_hidden)
    g, logits = head.tree(torch.tensor([1]), tokens, parents, torch.tensor([6]), padded, torch.arange(6)[None])
    assert rel_error(logits[0].numpy(), want_logits) < PARITY_BOUND
    assert rel_error(g[0, :6].numpy(), want_g) < PARITY_BOUND
    # the target: a depth-2 node of a branching tree committed, then a decode
    tree_pass = ref.tree_pass(tree.tokens, tree, cache)
    opt.verify(torch.tensor([1]), tokens, parents, torch.tensor([6], dtype=torch.int32))
    opt.commit(torch.tensor([1]), torch.tensor([4]))  # path 0, 2, 4
    ref.commit_pass(tree_pass, 4, cache)
    assert rel_error(opt.hidden_states(1, 3).numpy(), tree_pass.hidden[[0, 2, 4]]) < PARITY_BOUND
    _, decoded = ref.forward([8], cache, return_hidden=True)
    opt.decode(torch.tensor([1], dtype=torch.int32), torch.tensor([8]))
    assert rel_error(opt.hidden_states(1, 1).numpy(), decoded) < PARITY_BOUND


def test_optimized_head_pads_batches_with_other_slots_untouched(random_model):
    """Batches of 3 run padded to 4 with the free slot: every slot's entries and its trees' logits equal the
    reference head's, and the padding slot keeps its length and entries."""
    model = from_reference(random_model, num_slots=4, max_seq_len=16, max_nodes=4, graphs=False, dtype=torch.float32)
    head, ref_head = model.mtp_head(), MTPHead(random_model)
    rng = np.random.default_rng(4)
    pairs = {s: (rng.standard_normal((n, 32)), rng.integers(0, 64, n).tolist()) for s, n in ((1, 2), (0, 5), (2, 3),
                                                                                              (3, 1))}
    ref_caches = {s: ref_head.new_cache() for s in pairs}
    for s, (h, t) in pairs.items():
        ref_head.forward(h, t, ref_caches[s])
        head.reset(s)
    head.extend([1], [pairs[1][1]], [torch.tensor(pairs[1][0], dtype=torch.float32)])
    head.extend([0, 2, 3], [pairs[s][1] for s in (0, 2, 3)], [torch.tensor(pairs[s][0], dtype=torch.float32)
                                                                for s in (0, 2, 3)])  # padded with slot 1
    assert head.lens.tolist() == [5, 2, 3, 1]
    parents = torch.tensor([[-1, 0, 0, 1]] * 3, dtype=torch.int32)
    tokens = torch.from_numpy(rng.integers(0, 64, (3, 4)))
    hidden = torch.from_numpy(rng.standard_normal((3, 4, 32))).float()
    for batch in ([0, 2, 3], [1]):
        B = len(batch)
        g, logits = head.tree(torch.tensor(batch), tokens[:B], parents[:B], torch.full((B,), 4, dtype=torch.int32),
                              hidden[:B], torch.arange(4)[None].repeat(B, 1))
        for b, s in enumerate(batch):
            want, want_g = ref_head.tree(hidden[b].double().numpy(), tokens[b].tolist(),
                                         TokenTree([-1, 0, 0, 1], tokens[b].tolist()), ref_caches[s])
            assert rel_error(logits[b].numpy(), want) < PARITY_BOUND and rel_error(g[b].numpy(), want_g) < PARITY_BOUND
    assert head.lens.tolist() == [5, 2, 3, 1]


def test_optimized_head_of_a_block_fp8_checkpoint_matches_the_reference(tmp_path):
    """A block-FP8 checkpoint (``mtp.fc`` and the head's projections FP8, as releases store them): the optimized
    head on the FP8 weights equals the reference head on the dequantised ones."""
    from test_fp8 import write_fp8

    from lumotree.optimized.ops.gemv import Fp8Weight

    write_fp8(tmp_path, "qwen3_5_text")
    ref = load_pretrained(tmp_path)
    opt = load_optimized(tmp_path, num_slots=2, max_seq_len=32, max_nodes=8, graphs=False, dtype=torch.float32)
    assert isinstance(opt.weights.mtp.fc, Fp8Weight)
    head, ref_head = opt.mtp_head(), MTPHead(ref)
    prompt = [3, 1, 4, 1, 5, 9]
    _, hidden = ref.forward(prompt, ref.new_cache(), return_hidden=True)  # [T, D]
    opt.prefill(1, prompt)
    head.reset(1)
    head.extend([1], [prompt[1:]], [opt.hidden_states(1, len(prompt))[:-1]])
    cache = ref_head.new_cache()
    ref_head.forward(hidden[:-1], prompt[1:], cache)
    tree = TokenTree([-1, 0, 0, 1], [7, 2, 3, 4])
    tree_hidden = np.repeat(hidden[-1][None], 4, 0)  # [4, D]
    want, _ = ref_head.tree(tree_hidden, tree.tokens, tree, cache)
    _, logits = head.tree(torch.tensor([1]), torch.tensor([tree.tokens]), torch.tensor([tree.parents]),
                          torch.tensor([4]), torch.from_numpy(tree_hidden).float()[None], torch.arange(4)[None])
    assert rel_error(logits[0].numpy(), want) < PARITY_BOUND


# ================================================================================================== drafts
def head_logits_from_scratch(model: HybridModel, context: list[int], tokens: list[int], parents: list[int]):
    """Logits ``[n, V]`` of every node of a draft tree, the head recomputed from the whole context: the target run
    on ``context[:-1]``, its pairs appended, then the tree rooted at ``(h_{L-1}, context[-1])`` with each node reading
    its parent's output (one pass a depth)."""
    _, hidden = model.forward(context[:-1], model.new_cache(), return_hidden=True)  # [L, D]
    head = MTPHead(model)
    cache = head.new_cache()
    if len(context) > 2:
        head.forward(hidden[:-1], context[1:-1], cache)
    tree = TokenTree(parents, tokens)
    inputs = np.repeat(hidden[-1][None], len(tokens), 0)  # [n, D]
    up = np.maximum(np.array(parents), 0)
    for _ in range(max(tree.depth) + 1):
        logits, g = head.tree(inputs, tokens, tree, cache)
        inputs = np.where((np.array(parents) >= 0)[:, None], g[up], hidden[-1][None])
    return logits


def check_draft(model, context, draft, max_nodes, chain, depth, top_k, max_seq_len):
    """Structure (root, parents, confidences, size) and content (every node's confidence = its parent's times the
    head's probability of its token; a node's children are its most probable tokens; chains follow the argmax)."""
    n = draft.num_nodes
    assert draft.tokens[0] == context[-1] and draft.parents[0] == -1
    assert all(0 <= draft.parents[i] < i for i in range(1, n))
    assert 1 <= n <= max_nodes and max(draft.depth()) <= min(depth, max_seq_len - len(context))
    conf = draft.confidence
    assert conf[0] == 1 and np.all((conf > 0) & (conf <= 1))
    assert all(conf[i] <= conf[draft.parents[i]] for i in range(1, n))
    logits = head_logits_from_scratch(model, context, draft.tokens, draft.parents)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    for i in range(1, n):
        p = draft.parents[i]
        assert conf[i] == pytest.approx(conf[p] * probs[p, draft.tokens[i]], rel=1e-9)
    for p in range(n):
        children = [draft.tokens[i] for i in range(1, n) if draft.parents[i] == p]
        assert len(children) <= (1 if chain else top_k)
        assert sorted(children) == sorted(np.argsort(-probs[p])[: len(children)].tolist())


@pytest.mark.parametrize("chain", [True, False])
def test_drafts_equal_the_head_recomputed_from_scratch(random_model, chain):
    """Continuous batching (five requests through two slots, steps accepting nothing or a few tokens, fallback to
    single-token trees at the end of the context): every draft is what the head computes from scratch on the
    request's whole context, with valid structure."""
    target = ReferenceTarget(random_model, num_slots=2, max_seq_len=14, max_nodes=8)
    depth, top_k = 3, 2
    drafter = RecordingDrafter(target, depth=depth, top_k=top_k)
    prompts = [[5, 9, 2, 5, 9, 2], [7, 1, 7], [3], [4, 4, 4, 4, 4, 4, 4, 4, 4], [6, 2]]
    for max_nodes in (5, 2):
        generate(target, "chain" if chain else "tree", prompts, SamplingParams(max_new_tokens=7), max_nodes,
                 drafter)
    assert len(drafter.seen) > 20
    assert any(max(d.depth()) < min(depth, m - 1) for _, d, m, _ in drafter.seen)  # shallower at the context's end
    for context, draft, max_nodes, is_chain in drafter.seen:
        check_draft(random_model, context, draft, max_nodes, is_chain, depth, top_k, target.max_seq_len)
        if chain and draft.num_nodes > 1:
            assert draft.parents == list(range(-1, draft.num_nodes - 1))


@pytest.mark.parametrize("chain", [True, False])
def test_drafts_grown_in_one_device_call_equal_the_round_by_round_drafts(random_model, monkeypatch, chain):
    """The optimized head's greedy chains and top-k trees grown with every round on the device
    (:meth:`MTPHead.grow`, a batch of 3 padded to 4) are the drafts the round-by-round growth draws: same tokens,
    parents and confidences."""
    from lumotree.optimized.engine.drafters import DraftRequest
    from lumotree.optimized.model.mtp import MTPHead as OptimizedMTPHead

    model = from_reference(random_model, num_slots=4, max_seq_len=40, max_nodes=16, graphs=False, dtype=torch.float32)
    target = OptimizedTarget(model)
    prompts = {0: [5, 9, 2, 5, 9], 2: [7, 1, 7], 3: [3, 4, 4, 8, 1, 6]}
    drafts = {}
    for on_device in (True, False):
        drafter = MTPDrafter(target, depth=3, top_k=2)
        for slot, prompt in prompts.items():
            model.prefill(slot, prompt[:-1])
            drafter.admit(slot, prompt[:-1])
        requests = [DraftRequest(slot, prompt, SamplingParams()) for slot, prompt in prompts.items()]
        with monkeypatch.context() as patch:
            if not on_device:
                patch.setattr(OptimizedMTPHead, "grow", None)
            drafts[on_device] = drafter.propose(requests, 16, chain)
        for slot in prompts:
            drafter.release(slot)
            model.release(slot)
    for fast, slow in zip(drafts[True], drafts[False]):
        assert fast.num_nodes == slow.num_nodes == (4 if chain else 11)  # 1 + 2 + 2 x 2 + 2 x 2
        assert fast.tokens == slow.tokens and fast.parents == slow.parents
        assert np.allclose(fast.confidence, slow.confidence, rtol=1e-12, atol=0)


# ================================================================================================== greedy
@pytest.mark.parametrize("which", ["random", "echo"])
def test_greedy_mtp_speculation_equals_autoregressive_on_the_reference(random_model, echo, which):
    """Chain and tree speculation with the MTP drafter emit the greedy autoregressive tokens; with the echo head
    every drafted token is accepted (depth 3 a step)."""
    model = echo if which == "echo" else random_model
    prompts = [[5, 9, 2, 5, 9, 2, 5, 9], [7, 1, 7, 1, 7], [3]]
    params = SamplingParams(max_new_tokens=13)

    def target():
        return ReferenceTarget(model, num_slots=2, max_seq_len=40, max_nodes=8)

    want = [r.tokens for r in generate(target(), "autoregressive", prompts, params)]
    for mode in ("chain", "tree"):
        results = generate(target(), mode, prompts, params, depth=3, top_k=2)
        assert [r.tokens for r in results] == want, mode
        if which == "echo":
            assert all(r.accepted == 3 * r.steps for r in results), mode


def test_greedy_mtp_speculation_equals_autoregressive_on_the_optimized_model(echo):
    """The fp32 optimized model under the interpreter (its head, hidden states kept through the fused greedy step):
    chain and tree speculation with every drafted token accepted emit the reference's greedy tokens."""
    prompt = [[5, 9, 2, 5]]
    params = SamplingParams(max_new_tokens=7)
    want = [r.tokens for r in generate(ReferenceTarget(echo, 1, 32, 4), "autoregressive", prompt, params)]
    for mode in ("chain", "tree"):
        model = from_reference(echo, num_slots=1, max_seq_len=32, max_nodes=4, graphs=False, dtype=torch.float32)
        results = generate(OptimizedTarget(model), mode, prompt, params, max_nodes=4, depth=2, top_k=2)
        assert [r.tokens for r in results] == want, mode
        assert results[0].accepted == 2 * results[0].steps == 4, mode


def test_warm_up_runs_the_heads_shapes_and_leaves_every_slot_free(echo):
    """``Engine.warm_up`` with the MTP drafter also runs the head's extend and growth shapes (the optimized head under
    the interpreter), leaves the head's and the model's slots empty, and decoding afterwards is unchanged."""
    prompt = [[5, 9, 2, 5]]
    params = SamplingParams(max_new_tokens=7)
    want = [r.tokens for r in generate(ReferenceTarget(echo, 1, 32, 4), "autoregressive", prompt, params)]
    model = from_reference(echo, num_slots=1, max_seq_len=32, max_nodes=4, graphs=False, dtype=torch.float32)
    target = OptimizedTarget(model)
    drafter = MTPDrafter(target, depth=2, top_k=2)
    calls = []
    for name in ("extend", "grow"):
        original = getattr(drafter.head, name)
        setattr(drafter.head, name, lambda *a, _f=original, _n=name, **k: calls.append(_n) or _f(*a, **k))
    engine = Engine(target, drafter, mode="tree", budget="fixed", max_nodes=4, seed=1)
    engine.warm_up()
    assert calls.count("extend") == 2 * 3 and calls.count("grow") == 2 * 2  # widths 1, 2, 4; chains and trees
    assert drafter.head.lens.tolist() == [0] and engine.free_slots == [0]
    assert [r.tokens for r in engine.generate(prompt, params)] == want


def test_greedy_mtp_trees_on_a_qwen3_5_checkpoint_equal_autoregressive(tmp_path):
    """A random Qwen3.5 checkpoint with ``mtp.*`` tensors on disk (a random head: drafts accepted and rejected), read
    by the optimized loader (fp32, interpreter): tree speculation emits the reference's greedy tokens."""
    save_pretrained(build_random(HybridConfig(**TINY, model_type="qwen3_5_text"), seed=8), tmp_path)
    prompts, params = [[5, 9, 2, 5, 9, 2], [7, 1]], SamplingParams(max_new_tokens=4)
    want = [r.tokens for r in generate(ReferenceTarget(load_pretrained(tmp_path), 2, 32, 8), "autoregressive",
                                       prompts, params)]
    model = load_optimized(tmp_path, num_slots=2, max_seq_len=32, max_nodes=8, graphs=False, dtype=torch.float32)
    assert [r.tokens for r in generate(OptimizedTarget(model), "tree", prompts, params, depth=2, top_k=2)] == want


def test_generate_with_the_mtp_drafter(tmp_path, capsys, echo):
    """``lumotree generate --drafter mtp`` (reference backend) in chain and tree modes prints the tokens of
    ``--spec none``, accepting every drafted token of the echo head."""
    save_pretrained(echo, tmp_path / "ckpt")
    out = tmp_path / "out.json"
    results = {}
    for spec in ("none", "chain", "tree"):
        code = main(["generate", "--model", str(tmp_path / "ckpt"), "--backend", "reference", "--spec", spec,
                     "--drafter", "mtp", "--mtp-depth", "2", "--mtp-top-k", "2", "--budget", "fixed", "--max-nodes",
                     "4", "--max-new-tokens", "10", "--prompt", "5 9 2 5", "--json", str(out), "--quiet"])
        assert code == 0, capsys.readouterr().err
        results[spec] = json.loads(out.read_text())
    tokens = results["none"]["results"][0]["tokens"]
    assert len(tokens) == 10  # 1 from the prefill, then 3 steps of 2 drafted + 1
    for spec in ("chain", "tree"):
        assert results[spec]["results"][0]["tokens"] == tokens, spec
        assert results[spec]["summary"]["mean_accepted"] == 2, spec


# ================================================================================================== sampling
VOCAB4 = dict(vocab_size=4, hidden_size=16, intermediate_size=16, num_hidden_layers=2,
              layer_types=("linear_attention", "full_attention"), num_attention_heads=2, num_key_value_heads=1,
              head_dim=8, linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=1,
              linear_num_value_heads=2, num_experts=0, mtp_num_hidden_layers=1)


def exact_autoregressive(model, prompt, horizon, params: SamplingParams) -> dict[tuple[int, ...], float]:
    """The exact distribution of the first ``horizon`` sampled tokens (the engine's warping, float64)."""

    def probs(context):
        logits = torch.from_numpy(model.forward(context, model.new_cache())[-1])[None, None]  # [1, 1, V]
        return sampling.target_probs(logits, torch.tensor([params.temperature], dtype=torch.float64),
                                     torch.tensor([params.top_k]), torch.tensor([params.top_p], dtype=torch.float64))
    out = {}
    for seq in itertools.product(range(model.vocab_size), repeat=horizon):
        p = 1.0
        for i, tok in enumerate(seq):
            p *= float(probs(list(prompt) + list(seq[:i]))[0, 0, tok])
        out[seq] = p
    return out


def test_sampled_mtp_chains_are_lossless(monkeypatch):
    """Chi-square: the first 3 tokens of chain speculation with chains drawn from the head (``iid`` proposals,
    recursive rejection sampling) follow the exact autoregressive distribution, drafts being accepted; a verifier that
    resamples from the target after a rejection (no ``max(0, p - q)`` residual) fails the same test. (Skipping only
    the renormalisation cannot show on a chain: a chain node has one draw, and the final draw normalises.)"""
    model = build_random(HybridConfig(**VOCAB4), seed=2)
    prompt, horizon, copies = [1, 2, 3, 1, 2], 3, 1200
    params = SamplingParams(temperature=1.2, top_p=0.9)
    exact = exact_autoregressive(model, prompt, horizon, params)
    keys = sorted(exact)

    def counts() -> np.ndarray:
        target = ReferenceTarget(model, num_slots=copies, max_seq_len=16, max_nodes=8)
        results = generate(target, "chain", [prompt] * copies, [
            SamplingParams(temperature=1.2, top_p=0.9, seed=10_000 + i, max_new_tokens=horizon) for i in range(copies)],
            depth=2, sampled=True)
        assert sum(r.accepted for r in results) > copies // 4  # drafts really were accepted
        seen = {}
        for r in results:
            seen[tuple(r.tokens)] = seen.get(tuple(r.tokens), 0) + 1
        assert set(seen) <= set(keys)
        return np.array([seen.get(k, 0) for k in keys], dtype=np.float64)

    expected = np.array([exact[k] for k in keys])
    assert chi_square_pvalue(counts(), expected) > 1e-3

    def lossy(residual, proposal):
        return residual

    monkeypatch.setattr(sampling, "residual_after_rejection", lossy)
    assert chi_square_pvalue(counts(), expected) < 1e-6  # measured: about 1e-50


def test_top_k_mtp_trees_keep_the_seeded_autoregressive_text(random_model):
    """Sampling requests with top-k trees (deterministic drafts): each seeded request's text is the one
    autoregressive sampling gives with that seed."""
    prompts = [[5, 9, 2, 5, 9, 2], [7, 1, 7], [3]]
    params = [SamplingParams(temperature=0.8, top_k=20, seed=i, max_new_tokens=9) for i in range(3)]

    def target():
        return ReferenceTarget(random_model, num_slots=3, max_seq_len=32, max_nodes=8)

    want = [r.tokens for r in generate(target(), "autoregressive", prompts, params)]
    assert [r.tokens for r in generate(target(), "tree", prompts, params, depth=3, top_k=3)] == want


# ================================================================================================== bad input
def test_bad_inputs_are_refused_in_one_line(tmp_path, capsys, random_model):
    plain = build_random(HybridConfig(**{**TINY, "mtp_num_hidden_layers": 0}), seed=1)
    with pytest.raises(ValueError, match="no MTP head"):
        MTPDrafter(ReferenceTarget(plain))
    with pytest.raises(ValueError, match="no MTP head"):
        MTPHead(plain)
    with pytest.raises(ValueError, match="no MTP head"):
        from_reference(plain, num_slots=1, max_seq_len=8, max_nodes=2, graphs=False).mtp_head()
    target = ReferenceTarget(random_model)
    for name, value in (("depth", 0), ("top_k", 0), ("depth", True), ("top_k", 1.5)):
        with pytest.raises(ValueError, match=f"^{name} = "):
            MTPDrafter(target, **{name: value})
    with pytest.raises(ValueError, match="needs target"):
        make_drafter("mtp")
    with pytest.raises(TypeError, match="hands out no MTP head"):
        MTPDrafter(object())
    head = MTPHead(random_model)
    with pytest.raises(ValueError, match="^hidden has shape"):
        head.forward(np.zeros((2, 31)), [1, 2], head.new_cache())
    optimized = from_reference(random_model, num_slots=1, max_seq_len=8, max_nodes=2, graphs=False)
    with pytest.raises(RuntimeError, match="keep_hidden_states"):
        optimized.hidden_states(0, 1)
    save_pretrained(plain, tmp_path)
    for argv, words in (
        (["--model", str(tmp_path), "--drafter", "mtp"], ("--drafter mtp", "no mtp.* tensors")),
        (["--random", "tiny", "--drafter", "mtp", "--mtp-depth", "0"], ("--mtp-depth",)),
        (["--random", "tiny", "--drafter", "mtp", "--mtp-top-k", "0"], ("--mtp-top-k",)),
        (["--random", "tiny", "--drafter", "mtp", "--prefix-cache", "64"], ("--prefix-cache", "--drafter mtp")),
    ):
        code = main(["generate", *argv, "--backend", "reference", "--prompt", "1 2", "--quiet"])
        err = capsys.readouterr().err
        last = err.strip().splitlines()[-1]
        assert code == 2 and "Traceback" not in err and last.startswith("error: "), err
        assert all(word in last for word in words), last
