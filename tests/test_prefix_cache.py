"""The hybrid prefix cache: exact (a prompt restored from a cached prefix gives the greedy tokens of a cold prefill,
token for token, on the reference backend and on the optimized model under the Triton interpreter), bounded (never
more bytes than its budget, whatever is inserted), and the longest held prefix is the one restored."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lumotree.optimized import model as om
from lumotree.optimized.engine import Engine, OptimizedTarget, PrefixCache, ReferenceTarget, make_drafter
from lumotree.optimized.engine.prefix_cache import nbytes, parse_size
from lumotree.optimized.engine.sampling import SamplingParams
from lumotree.reference import model as rm
from lumotree.reference.config import HybridConfig

TINY = dict(vocab_size=24, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
            layer_types=("linear_attention", "full_attention", "linear_attention"), num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, linear_key_head_dim=16, linear_value_head_dim=16,
            linear_num_key_heads=2, linear_num_value_heads=4, num_experts=0, rope_theta=1000.0)


@pytest.fixture(scope="module")
def reference_model():
    return rm.build_random(HybridConfig(**TINY), seed=5)


# ================================================================================================== the table alone
def _rows(tokens):
    """A fake slot: K / V row i is token i; the state is the tokens so far."""
    return (lambda start, end: np.asarray(tokens[start:end], dtype=np.float64),
            lambda: np.asarray([len(tokens), *tokens], dtype=np.float64))


def _insert(cache, tokens):
    return cache.insert(tokens, *_rows(tokens))


def test_match_restores_the_longest_held_prefix_from_blocks_and_tail():
    cache = PrefixCache(1 << 20, block_tokens=4)
    a = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert _insert(cache, a) and _insert(cache, a[:4]) and len(cache) == 2
    hit = cache.match(a + [11, 12])
    assert hit.length == 10 and hit.state.tolist() == [10, *a]
    assert [(s, e) for s, e, _ in hit.kv] == [(0, 4), (4, 8), (8, 10)]
    assert np.concatenate([rows for _, _, rows in hit.kv]).tolist() == a  # every row, in place
    assert cache.match(a, limit=9).length == 4  # the tail snapshot ends past the limit: the block-grid one
    assert cache.match([1, 2, 3, 4, 5, 0, 0]).length == 4  # diverges inside the second block
    assert cache.match([9, 9, 9, 9, 9]) is None and cache.match([1, 2, 3]) is None
    assert cache.stats.hits == 3 and cache.stats.queries == 5 and cache.stats.hit_tokens == 18
    short = [7, 7]  # shorter than a block: a root snapshot
    assert _insert(cache, short) and cache.match([7, 7, 1]).length == 2 and short in cache and [7] not in cache


def test_blocks_are_shared_and_go_with_the_last_snapshot_that_needs_them():
    cache = PrefixCache(1 << 20, block_tokens=2)
    reads = []

    def insert(tokens):
        kv, state = _rows(tokens)
        return cache.insert(tokens, lambda s, e: reads.append((s, e)) or kv(s, e), state)

    insert([1, 2, 3, 4, 5])
    assert reads == [(0, 2), (2, 4), (4, 5)] and len(cache.blocks) == 2
    reads.clear()
    insert([1, 2, 3, 4, 9, 9])  # shares two blocks: only the new one is read
    assert reads == [(4, 6)] and len(cache.blocks) == 3
    insert([1, 2, 3, 4, 9, 9])  # held already: nothing read, no copy
    assert reads == [(4, 6)] and cache.stats.stored == 2
    cache._evict(next(iter(cache.lru.values())))  # the first snapshot: its blocks stay for the second
    assert len(cache.blocks) == 3 and cache.match([1, 2, 3, 4, 5, 6]) is None  # no state at 2, 4 or 5 any more
    assert cache.match([1, 2, 3, 4, 9, 9, 1]).length == 6
    cache.clear()
    assert cache.stats.bytes == 0 and not cache.blocks and not cache.root and len(cache) == 0


def test_a_hash_collision_is_a_miss(monkeypatch):
    cache = PrefixCache(1 << 20, block_tokens=2)
    monkeypatch.setattr(PrefixCache, "_key", staticmethod(lambda parent, tokens: 7))  # every block collides
    assert _insert(cache, [1, 2, 3])
    assert cache.match([1, 2, 3, 4]).length == 3
    assert cache.match([5, 6, 3, 4]) is None  # same hash, other tokens: compared, not trusted
    assert not _insert(cache, [5, 6, 3])  # not kept over the other block


@settings(max_examples=60)
@given(st.integers(1, 5), st.integers(40, 400),
       st.lists(st.tuples(st.integers(0, 3), st.integers(1, 14)), min_size=1, max_size=25))
def test_bounded_and_consistent_under_any_insertions(block, budget, requests):
    """Bytes held never pass the budget and equal what the blocks and snapshots hold; every hit restores its tokens
    exactly; a snapshot that fits alone is held right after its insertion."""
    cache = PrefixCache(budget, block_tokens=block)
    rng = np.random.default_rng(block * 1000 + budget)
    stems = [rng.integers(0, 3, 14).tolist() for _ in range(4)]
    for stem, length in requests:
        tokens = stems[stem][:length]
        held = _insert(cache, tokens)
        assert cache.stats.bytes <= budget
        counted = sum(b.size for b in cache.blocks.values()) + sum(s.size for s in cache.lru.values())
        assert cache.stats.bytes == counted
        size_alone = 8 * (len(tokens) + 1 + len(tokens))  # its rows and its state, all blocks new
        if size_alone <= budget:
            assert held and tokens in cache
        hit = cache.match(tokens + [9])
        if hit is not None:
            assert np.concatenate([rows for _, _, rows in hit.kv]).tolist() == tokens[: hit.length]
            assert hit.state.tolist() == [hit.length, *tokens[: hit.length]]


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="budget_bytes"):
        PrefixCache(0)
    with pytest.raises(ValueError, match="block_tokens"):
        PrefixCache(100, block_tokens=0)
    for bad in ("lots", "-1G", "1Q", "nan"):
        with pytest.raises(ValueError, match="not a size"):
            parse_size(bad)
    assert parse_size("512MiB") == 512 << 20 and parse_size("2G") == 2 << 30 and parse_size("0") == 0
    assert parse_size("64") == 64 << 20 and parse_size("1.5kib") == 1536
    with pytest.raises(ValueError, match="prefix_cache"):
        Engine(_CountingTarget(), prefix_cache=PrefixCache(100), mode="autoregressive")


class _CountingTarget:
    """A model without the prefix-cache methods."""

    vocab_size, max_seq_len, num_slots, max_nodes, device = 4, 16, 2, 4, torch.device("cpu")

    def prefill(self, slot, tokens): ...

    def decode(self, slots, tokens): ...

    def verify(self, slots, trees): ...

    def commit(self, slots, trees, accepted): ...

    def release(self, slot): ...


# ================================================================================================== in the engine
def _engine(target, mode, cache):
    drafter = make_drafter("ngram") if mode == "tree" else None
    return Engine(target, drafter, mode=mode, budget="fixed", max_nodes=4, prefix_cache=cache)


def _run_turns(engine, turns, extend_output, block=1):
    """Each turn extends an earlier turn's prompt (with its output when ``extend_output``) by a few tokens, alone or
    beside a second request that differs in its last token. Returns the outputs, and per request the tokens restored
    and the fewest a cache without evictions restores (the earlier request's kept context, or the last block
    boundary of its prompt)."""
    outputs, hits, history = [], [], []
    params = SamplingParams(max_new_tokens=4)
    for base, tail, together in turns:
        earlier = history[base % len(history)] if history else None
        prompt = (earlier[0] if earlier else []) + tail
        group = [prompt] + ([prompt[:-1] + [(prompt[-1] + 1) % TINY["vocab_size"]]] if together else [])
        ids = engine.submit_all(group, params)
        while engine.has_work():
            engine.step()
        for i, p in zip(ids, group):
            request = engine.finished[i]
            outputs.append(list(request.output))
            hits.append((request.prefix_hit, earlier[1] if earlier else 0))
            kept = len(p) + len(request.output) - 1 if extend_output else (len(p) - 1) // block * block
            history.append((p + (list(request.output) if extend_output else []), kept))
    return outputs, hits


turn_lists = st.lists(st.tuples(st.integers(0, 9), st.lists(st.integers(0, TINY["vocab_size"] - 1), min_size=1,
                                                                    max_size=7), st.booleans()),
                      min_size=2, max_size=5)


@settings(max_examples=12)
@given(turn_lists, st.sampled_from(["autoregressive", "tree"]), st.integers(1, 6), st.booleans(),
       st.sampled_from([1 << 20, 3000]))
def test_cached_prefix_gives_the_cold_tokens_reference(reference_model, turns, mode, block, extend, budget):
    """Shared-prefix request sequences (each turn extends an earlier prompt, with or without its output; some run two
    at a time), greedy: the tokens with the prefix cache (a roomy budget, or one that evicts) equal those without,
    on the float64 reference."""
    def target():
        return ReferenceTarget(reference_model, num_slots=3, max_seq_len=96, max_nodes=8)

    cold, _ = _run_turns(_engine(target(), mode, None), turns, extend)
    cache = PrefixCache(budget, block_tokens=block)
    warm, hits = _run_turns(_engine(target(), mode, cache), turns, extend, block)
    assert warm == cold
    assert cache.stats.bytes <= budget
    if budget == 1 << 20:  # nothing evicted: each turn restores at least what its earlier request kept
        assert all(hit >= least for hit, least in hits)


def test_a_junction_snapshot_serves_the_prompts_that_share_it(reference_model):
    """A prompt that shares cached blocks without a state at their end (here: the start of a long prompt) prefills
    them once more and keeps the states at the junction; the next prompt with the same start restores them."""
    rng = np.random.default_rng(1)
    long = rng.integers(0, TINY["vocab_size"], 20).tolist()  # its states: at 16 and at its end
    b, c = (long[:10] + rng.integers(0, TINY["vocab_size"], 4).tolist() for _ in range(2))
    params = SamplingParams(max_new_tokens=3)
    cache = PrefixCache(1 << 20, block_tokens=4)
    engine = _engine(ReferenceTarget(reference_model, num_slots=2, max_seq_len=96), "autoregressive", cache)
    cold = _engine(ReferenceTarget(reference_model, num_slots=2, max_seq_len=96), "autoregressive", None)
    hits = []
    for prompt in (long, b, c):
        result = engine.generate([prompt], params)[0]
        hits.append(engine.finished[result.request_id].prefix_hit)
        assert result.tokens == cold.generate([prompt], params)[0].tokens
    assert hits == [0, 0, 8] and long[:8] in cache


def test_a_turn_prefills_only_its_new_tokens(reference_model):
    """An agent's second turn (its first turn's prompt and output, then a tool output) restores the first turn's
    cached context: the model runs only the new tokens, and the text is the cold one."""
    ran = []

    class Counting(ReferenceTarget):
        def prefill(self, slot, tokens, start=0):
            ran.append(len(tokens))
            return super().prefill(slot, tokens, start)

    params = SamplingParams(max_new_tokens=6)
    engine = _engine(Counting(reference_model, num_slots=2, max_seq_len=96), "autoregressive", PrefixCache(1 << 20, 8))
    first = engine.generate([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3]], params)[0]
    context = first.prompt + first.tokens
    ran.clear()
    turn = context + [7, 7, 8]
    second = engine.generate([turn], params)[0]
    cached = len(context) - 1  # the last output token was sampled, never run
    assert engine.finished[second.request_id].prefix_hit == cached and sum(ran) == len(turn) - cached
    cold = _engine(ReferenceTarget(reference_model, num_slots=2, max_seq_len=96), "autoregressive", None)
    assert second.tokens == cold.generate([turn], params)[0].tokens


def test_cached_prefix_gives_the_cold_tokens_optimized(reference_model):
    """The same on the optimized fp32 model (Triton interpreter on a CPU; a fixed sequence, as the interpreter is
    slow; the mode-independent bookkeeping is the reference test's): K / V rows and GDN / conv states restored into a
    slot, the chunked prefill going on from them, and the prompt-grid snapshot of a request admitted beside another.
    The cold tokens are the float64 reference engine's (the same greedy tokens on this model)."""
    model = om.from_reference(reference_model, num_slots=2, max_seq_len=32, max_nodes=4, graphs=False,
                              dtype=torch.float32)
    turns = [(0, [3, 1, 4, 1, 5, 9, 2], False), (0, [6, 5], True)]
    cold, _ = _run_turns(_engine(ReferenceTarget(reference_model, num_slots=2, max_seq_len=32), "autoregressive",
                                 None), turns, True)
    cache = PrefixCache(1 << 20, block_tokens=4)
    warm, hits = _run_turns(_engine(OptimizedTarget(model, batch_buckets=(1, 2)), "autoregressive", cache), turns,
                            True, 4)
    assert warm == cold
    assert all(hit >= least for hit, least in hits) and hits[-1][0] > 0
    assert nbytes(next(iter(cache.lru.values())).state) > 0


# ================================================================================================== GPU
GPU_CFG = dict(vocab_size=4096, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
               layer_types=("linear_attention", "linear_attention", "linear_attention", "full_attention"),
               num_attention_heads=16, num_key_value_heads=2, head_dim=256, linear_key_head_dim=128,
               linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32, num_experts=0,
               rope_theta=10_000_000.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_block_grid_hits_are_bitwise_cold_bf16():
    """bf16 with CUDA graphs and blocks of ``max_nodes`` tokens: a prompt that restores a block-grid snapshot
    prefills the same chunks a cold prefill does, so its greedy tokens are the cold ones exactly; a turn restoring
    a request's end snapshot (chunks cut elsewhere) restores the whole earlier context."""
    from lumotree.optimized.model import random_tensors

    config = HybridConfig(**GPU_CFG)
    weights = random_tensors(config, 4, torch.device("cuda"), torch.bfloat16)

    def engine(cache):
        model = om.OptimizedModel(config, weights, num_slots=4, max_seq_len=1024, max_nodes=64)
        return Engine(OptimizedTarget(model, validate=False), mode="autoregressive", prefix_cache=cache)

    rng = np.random.default_rng(0)
    first = rng.integers(0, 4096, 300).tolist()
    second, third = (first[:200] + rng.integers(0, 4096, 40).tolist() for _ in range(2))  # 192 = 3 blocks shared
    params = SamplingParams(max_new_tokens=32)
    cold = engine(None).generate([third], params)[0].tokens
    cache = PrefixCache(1 << 30, block_tokens=64)
    warm = engine(cache)
    done = warm.generate([first], params)[0]
    warm.generate([second], params)  # no state at 192 yet: prefilled again, its junction kept
    again = warm.generate([third], params)[0]
    assert warm.finished[again.request_id].prefix_hit == 192 and again.tokens == cold
    turn = done.prompt + done.tokens + rng.integers(0, 4096, 50).tolist()
    extended = warm.generate([turn], params)[0]
    assert warm.finished[extended.request_id].prefix_hit == len(done.prompt) + len(done.tokens) - 1
