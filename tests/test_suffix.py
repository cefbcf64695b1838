"""Suffix decoding: the suffix tree against a brute-force matcher (counts, continuations, removal, memory), the
candidate trees against a brute-force best-first search, the global cache's bounded memory over 10^4 requests and its
LRU eviction, and the drafter lossless through the engine (reference backend)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lumotree.optimized.engine import Engine, ReferenceTarget, make_drafter
from lumotree.optimized.engine.drafters import DraftRequest
from lumotree.optimized.engine.sampling import SamplingParams
from lumotree.optimized.engine.suffix import SuffixCache, SuffixDrafter, SuffixTree
from lumotree.reference.model import HybridConfig, build_random

token_strings = st.lists(st.integers(0, 3), min_size=0, max_size=30)


def brute_count(sequences, pattern) -> int:
    n = len(pattern)
    return sum(1 for s in sequences for i in range(len(s) - n + 1) if tuple(s[i:i + n]) == tuple(pattern))


def substrings(sequences, depth) -> set[tuple[int, ...]]:
    return {tuple(s[i:j]) for s in sequences for i in range(len(s)) for j in range(i + 1, min(len(s), i + depth) + 1)}


def brute_continuations(sequences, pattern, depth) -> dict[tuple[int, ...], int]:
    """Every w (1 <= |w| <= depth - |pattern|) with its count of pattern + w, where it occurs."""
    out = {}
    for sub in substrings(sequences, depth):
        if len(sub) > len(pattern) and sub[:len(pattern)] == tuple(pattern):
            out[sub[len(pattern):]] = brute_count(sequences, sub)
    return out


def build(sequences, depth, chunks: list[int] | None = None) -> SuffixTree:
    tree = SuffixTree(depth)
    for sid, s in enumerate(sequences):
        cut = 0
        for size in (chunks or [len(s)]):  # appended in pieces: the same tree as in one go
            tree.extend(sid, s[cut:cut + size])
            cut += size
        tree.extend(sid, s[cut:])
    return tree


@settings(max_examples=60)
@given(st.lists(token_strings, min_size=1, max_size=3), st.integers(1, 6),
       st.lists(st.integers(0, 5), max_size=4), st.lists(st.integers(0, 3), max_size=7), st.data())
def test_suffix_tree_counts_and_continuations_match_brute_force(sequences, depth, chunks, pattern, data):
    tree = build(sequences, depth, chunks)
    subs = substrings(sequences, depth)
    assert tree.num_nodes == len(subs)  # one node per distinct substring of length <= depth: exact memory
    assert tree.num_tokens == sum(len(s) for s in sequences)
    for sub in list(subs) + [tuple(pattern[:depth])]:
        assert tree.count(sub) == brute_count(sequences, sub) if sub else True
        assert tree.continuations(sub) == brute_continuations(sequences, sub, depth)
    # removing sequences leaves the tree of the others, node for node
    gone = data.draw(st.sets(st.sampled_from(range(len(sequences)))))
    for sid in gone:
        tree.remove(sid)
    rest = [s for i, s in enumerate(sequences) if i not in gone]
    assert tree.num_nodes == len(substrings(rest, depth)) and tree.memory == tree.num_nodes + sum(map(len, rest))
    for sub in substrings(sequences, depth):
        assert tree.count(sub) == brute_count(rest, sub)


def brute_candidate_score(sequences, pattern, depth, max_spec, factor, offset, min_prob) -> float:
    """max over match lengths L of the sum of the top-budget(L) empirical frequencies >= min_prob."""
    best = 0.0
    for length in range(1, min(len(pattern), depth - 1) + 1):
        suffix = tuple(pattern[len(pattern) - length:])
        total = brute_count(sequences, suffix)
        if total == 0:
            break
        budget = min(max_spec, int(length * factor + offset + 1e-9))
        probs = sorted((c / total for c in brute_continuations(sequences, suffix, depth).values()), reverse=True)
        best = max(best, sum(p for p in probs[:max(budget, 0)] if p >= min_prob))
    return best


@settings(max_examples=80)
@given(st.lists(token_strings, min_size=1, max_size=3), st.integers(2, 6), st.lists(st.integers(0, 3), min_size=1,
       max_size=6), st.integers(1, 8), st.sampled_from([0.5, 1.0, 2.0]), st.sampled_from([0.0, 1.0]),
       st.sampled_from([0.0, 0.1, 0.3]))
def test_candidate_trees_are_the_most_frequent_continuations(sequences, depth, pattern, max_spec, factor, offset,
                                                             min_prob):
    """The tree candidate: every node's confidence is its empirical frequency count(match + path) / count(match);
    it holds at most floor(factor * L + offset) nodes, none below min_token_prob, the most frequent ones (its score is
    the brute-force best over all match lengths); the path candidate follows the most frequent child."""
    tree = build(sequences, depth)
    c = tree.speculate(pattern, max_spec, factor, offset, min_prob, tree=True)
    want = brute_candidate_score(sequences, pattern, depth, max_spec, factor, offset, min_prob)
    assert c.score == pytest.approx(want)
    if not c.tokens:
        assert want == 0
        return
    match = tuple(pattern[len(pattern) - c.match_len:])
    total = brute_count(sequences, match)
    assert len(c.tokens) <= min(max_spec, int(c.match_len * factor + offset + 1e-9))
    assert all(b <= a for a, b in zip(c.probs, c.probs[1:]))  # best-first
    for i, (tok, parent, prob) in enumerate(zip(c.tokens, c.parents, c.probs)):
        assert -1 <= parent < i
        path = [tok]
        while parent >= 0:
            path.insert(0, c.tokens[parent])
            parent = c.parents[parent]
        assert prob == pytest.approx(brute_count(sequences, match + tuple(path)) / total) and prob >= min_prob
    chain = tree.speculate(pattern, max_spec, factor, offset, min_prob, tree=False)
    assert chain.parents == list(range(-1, len(chain.tokens) - 1))
    assert chain.score <= c.score + 1e-12


@settings(max_examples=60)
@given(st.lists(token_strings, min_size=1, max_size=3), st.integers(2, 6), st.integers(0, 3), st.booleans())
def test_match_nodes_of_an_open_sequence_are_the_walked_suffix_nodes(sequences, depth, token, tree_mode):
    """For the last (open) sequence and a next token, ``match_nodes`` gives the node of every occurring suffix of
    ``sequence + [token]`` (shortest first) as ``find`` walks it, and speculating from them is speculating from the
    pattern."""
    tree = build(sequences, depth)
    context = sequences[-1] + [token]
    nodes = tree.match_nodes(len(sequences) - 1, token)
    walked = []
    for length in range(1, min(len(context), depth - 1) + 1):
        node = tree.find(context[-length:])
        if node is None:
            break
        walked.append(node)
    assert nodes == walked
    pattern = context[-(depth - 1):]
    fast = tree.speculate(pattern, 8, 2.0, 1.0, 0.1, tree=tree_mode, nodes=nodes)
    slow = tree.speculate(pattern, 8, 2.0, 1.0, 0.1, tree=tree_mode)
    assert (fast.tokens, fast.parents, fast.probs, fast.match_len) == (slow.tokens, slow.parents, slow.probs,
                                                                       slow.match_len)


def test_global_cache_stays_under_its_memory_limit_over_ten_thousand_requests():
    """10^4 requests through the drafter (admit, advance, propose, release): after every release the global tree
    holds at most `capacity` entries and `max_cached_requests` outputs, and its node count is exact (a fresh tree of
    the cached outputs has as many nodes)."""
    rng = np.random.default_rng(0)
    capacity = 3000
    drafter = SuffixDrafter(max_depth=6, max_cached_requests=400, cache_capacity=capacity)
    slots = 4
    peak = 0
    for i in range(10_000):
        slot = i % slots
        prompt = rng.integers(0, 12, size=3).tolist()
        drafter.admit(slot, prompt)
        output = rng.integers(0, 12, size=int(rng.integers(1, 16))).tolist()
        context = list(prompt)
        for start in range(0, len(output), 5):
            context += output[start:start + 5]
            if i % 50 == 0:
                drafter.propose([DraftRequest(slot, context, SamplingParams())], 8, False)
            drafter.advance([DraftRequest(slot, context, SamplingParams())], [output[start:start + 5]])
        drafter.release(slot)
        peak = max(peak, drafter.cache.memory)
        assert drafter.cache.memory <= capacity and len(drafter.cache) <= 400
    assert peak > capacity * 0.8 and drafter.cache.evicted > 9000
    fresh = SuffixTree(6)
    for sid, seq in drafter.cache.tree.sequences.items():
        fresh.extend(sid, seq)
    assert fresh.num_nodes == drafter.cache.tree.num_nodes


def test_global_cache_evicts_the_least_recently_used_output_and_refuses_oversized_ones():
    cache = SuffixCache(max_depth=4, max_requests=3, capacity=10_000)
    a, b, c = (cache.insert(s) for s in ([1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]))
    assert cache.speculate([1, 2], 4).tokens[:2] == [3, 4]  # drafting from a's output uses it
    cache.insert([13, 14])
    assert set(cache.tree.sequences) == {a, c, 3}  # b was least recently used
    small = SuffixCache(max_depth=4, max_requests=10, capacity=12)
    assert small.insert(list(range(20))) is None and small.memory == 0 and len(small) == 0
    assert SuffixCache(max_requests=0).insert([1, 2]) is None
    with pytest.raises(ValueError, match="capacity"):
        SuffixCache(capacity=0)
    with pytest.raises(ValueError, match="min_token_prob"):
        SuffixDrafter(min_token_prob=1.5)
    with pytest.raises(ValueError, match="max_depth"):
        SuffixDrafter(max_depth=1)


def test_suffix_drafter_proposes_calibrated_trees_from_its_own_tokens_and_from_finished_outputs():
    d = SuffixDrafter(max_depth=8, max_spec_factor=1.0, max_spec_offset=0.0)
    d.admit(0, [1, 2, 3, 9, 1, 2, 4, 9, 1, 2, 3])
    [draft] = d.propose([DraftRequest(0, [1, 2, 3, 9, 1, 2, 4, 9, 1, 2, 3, 9], SamplingParams())], 16, False)
    # pattern "... 9": "1 2 3 9" seen once before, so the longest match continues "1 2 4 9" with frequency 1
    assert draft.tokens[0] == 9 and draft.tokens[1:4] == [1, 2, 4] and np.allclose(draft.confidence[:4], 1.0)
    d.advance([DraftRequest(0, [], SamplingParams())], [[9, 7, 7, 8, 6]])
    d.release(0)
    assert not d.cache.tree.sequences  # inserted at the next admission
    d.admit(1, [5, 5])
    assert d.cache.tree.sequences[0] == [9, 7, 7, 8, 6]  # the committed output, prompt excluded
    # only the finished output knows "9" and "9 7"; a match of length L drafts at most L tokens (factor 1)
    [short] = d.propose([DraftRequest(1, [5, 5, 9], SamplingParams())], 16, True)
    d.advance([DraftRequest(1, [], SamplingParams())], [[9]])
    [longer] = d.propose([DraftRequest(1, [5, 5, 9, 7], SamplingParams())], 16, True)
    assert short.tokens == [9, 7] and longer.tokens == [7, 7, 8] and d.picks["global"] == 2
    far = SuffixDrafter(max_depth=8, cache=d.cache)  # the defaults: a match of length L drafts 3 L + 1 tokens
    far.admit(1, [5, 5])
    [draft] = far.propose([DraftRequest(1, [5, 5, 9], SamplingParams())], 16, True)
    assert draft.tokens == [9, 7, 7, 8, 6]


def test_suffix_drafter_is_lossless_through_the_engine_and_reuses_finished_outputs():
    """Greedy chain and tree speculation with the suffix drafter emit the autoregressive tokens; a second pass over
    the same prompts drafts from the first pass's outputs (global cache) and accepts most of them."""
    config = HybridConfig(vocab_size=48, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_key_heads=2,
                          linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8, num_experts=0,
                          layer_types=("linear_attention", "full_attention"))
    model = build_random(config, seed=3)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 48, size=n).tolist() for n in (3, 6, 4)]
    params = SamplingParams(max_new_tokens=10)
    reference = Engine(ReferenceTarget(model, num_slots=2, max_seq_len=64), mode="autoregressive").generate(prompts,
                                                                                                            params)
    for mode in ("chain", "tree"):
        drafter = make_drafter("suffix", max_depth=8)
        engine = Engine(ReferenceTarget(model, num_slots=2, max_seq_len=64), drafter, mode=mode, budget="fixed",
                        max_nodes=8)
        first = engine.generate(prompts, params)
        accepted_first = sum(r.accepted for r in first)
        second = engine.generate(prompts, params)
        assert [r.tokens for r in first] == [r.tokens for r in reference], mode
        assert [r.tokens for r in second] == [r.tokens for r in reference], mode
        assert drafter.picks["global"] > 0 and sum(r.accepted for r in second) > accepted_first + 10


def test_sampled_text_with_the_suffix_drafter_is_the_autoregressive_text():
    """Sampling (temperature 1, top-p 0.9): deterministic drafts are verified with the coins of each output position,
    so the suffix drafter's text is the one autoregressive sampling draws with the same seed."""
    config = HybridConfig(vocab_size=16, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_key_heads=2,
                          linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8, num_experts=0,
                          layer_types=("linear_attention", "full_attention"))
    model = build_random(config, seed=4)
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 4, 5, 4]]
    params = [SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.9, seed=s) for s in (7, 8)]
    ar = Engine(ReferenceTarget(model, num_slots=2, max_seq_len=64), mode="autoregressive").generate(prompts, params)
    drafter = SuffixDrafter(max_depth=8)
    engine = Engine(ReferenceTarget(model, num_slots=2, max_seq_len=64), drafter, mode="tree", budget="fixed",
                    max_nodes=6)
    for _ in range(2):  # the second pass drafts from the first's outputs
        out = engine.generate(prompts, params)
        assert [r.tokens for r in out] == [r.tokens for r in ar]
    assert drafter.picks["global"] > 0 and sum(r.accepted for r in out) >= 10
