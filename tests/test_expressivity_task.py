"""The parity-conditioned retrieval task: generator, exact answer against a brute-force oracle, parsing, scorer,
and clear errors on bad parameters."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lumotree.expressivity import task
from lumotree.expressivity.task import Instance, TaskSpec, Vocabulary


def oracle(tokens, num_keys, num_values):
    """Brute force on token names: count the '1' bits, scan the pairs, look the queried key up."""
    vocab = Vocabulary(num_keys, num_values)
    names = [vocab.name(t) for t in tokens]
    sep = names.index("<sep>")
    parity = names[1:sep].count("1") % 2
    query = names[-2 + parity]
    pairs = names[sep + 1 : -3]
    for j in range(0, len(pairs), 2):
        if pairs[j] == query:
            return next(t for t in range(vocab.size) if vocab.name(t) == pairs[j + 1])
    raise AssertionError("query not found")


specs = st.builds(
    lambda n, m, extra_keys, R: TaskSpec(n, m, m + extra_keys, R),
    st.integers(1, 40), st.integers(2, 8), st.integers(0, 5), st.integers(1, 9),
)


@settings(max_examples=60)
@given(spec=specs, seed=st.integers(0, 2**32 - 1))
def test_answer_matches_brute_force_oracle(spec, seed):
    for inst in task.generate(spec, 5, seed=seed):
        tokens = inst.tokens
        assert len(tokens) == spec.length
        assert task.answer(tokens, spec.num_keys, spec.num_values) == oracle(tokens, spec.num_keys, spec.num_values)
        assert inst.answer == oracle(tokens, spec.num_keys, spec.num_values)
        assert task.parse(tokens, spec.num_keys, spec.num_values) == inst


@settings(max_examples=30)
@given(spec=specs, seed=st.integers(0, 2**32 - 1))
def test_generated_instances_are_well_formed(spec, seed):
    for inst in task.generate(spec, 8, seed=seed):
        assert len(inst.bits) == spec.n and len(inst.keys) == spec.m
        assert len(set(inst.keys)) == spec.m
        q0, q1 = inst.queries
        assert q0 != q1 and q0 in inst.keys and q1 in inst.keys
        assert inst.tokens[0] == task.BOS and inst.tokens[spec.n + 1] == task.SEP
        assert inst.tokens[-3] == task.QUERY


def test_generator_is_seeded_and_covers_both_parities():
    spec = TaskSpec(7, 4, 6, 5)
    a, b, c = (task.generate(spec, 200, seed=s) for s in (3, 3, 4))
    assert a == b
    assert a != c
    parities = [inst.parity for inst in a]
    assert 60 < sum(parities) < 140
    assert len({inst.answer for inst in a}) == 5  # every value appears


def test_answer_depends_on_the_parity_of_all_bits():
    inst = Instance((1, 0, 1), (0, 1, 2), (4, 5, 6), (1, 2), 3, 7)
    assert inst.parity == 0 and inst.answer_index == 5  # q_0 = K1 stores V5
    flipped = Instance((1, 0, 0), (0, 1, 2), (4, 5, 6), (1, 2), 3, 7)
    assert flipped.parity == 1 and flipped.answer_index == 6
    assert inst.render() == "<bos> 1 0 1 <sep> K0 V4 K1 V5 K2 V6 ? K1 K2"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(n=0, m=2, num_keys=4, num_values=4), "n = 0 must be >= 1"),
        (dict(n=3, m=5, num_keys=4, num_values=4), "m = 5 pairs need m distinct keys"),
        (dict(n=3, m=1, num_keys=4, num_values=4), "m = 1 must be >= 2"),
        (dict(n=3, m=2, num_keys=4, num_values=0), "num_values = 0 must be >= 1"),
    ],
)
def test_bad_task_parameters_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TaskSpec(**kwargs)


def test_non_integer_parameters_are_rejected():
    with pytest.raises(TypeError, match="n = 2.0 must be an integer"):
        TaskSpec(2.0, 2, 3, 3)
    with pytest.raises(TypeError, match="must be an integer"):
        TaskSpec(True, 2, 3, 3)


@pytest.mark.parametrize(
    "args, message",
    [
        (((1,), (0, 1), (0, 0), (0, 2)), "query q_1 = K2 is not among the keys"),
        (((1,), (0, 1), (0, 0), (1, 1)), "q_0 = q_1 = K1"),
        (((1,), (0, 0), (0, 0), (0, 1)), "not distinct"),
        (((2,), (0, 1), (0, 0), (0, 1)), "bits must be 0 or 1"),
        (((), (0, 1), (0, 0), (0, 1)), "n = 0"),
        (((1,), (0, 1), (0, 9), (0, 1)), r"values \[9\] are outside"),
        (((1,), (0, 1, 2, 3, 4), (0,) * 5, (0, 1)), "m = 5 pairs need m distinct keys"),
    ],
)
def test_bad_instances_raise_clear_errors(args, message):
    with pytest.raises(ValueError, match=message):
        Instance(*args, num_keys=4, num_values=3)


@pytest.mark.parametrize(
    "tokens, message",
    [
        ([1, 3, 5, 9, 6, 10, 4, 5, 6], "starts with BOS"),
        ([0, 1, 5, 9, 6, 10, 4, 5, 6], "no SEP"),
        ([0, 1, 3, 5, 9, 6, 10, 4, 5, 7], "not among the keys"),
        ([0, 1, 3, 5, 9, 6, 4, 5, 6], "expected key-value pairs"),
        ([0, 1, 3, 9, 5, 6, 10, 4, 5, 6], "should be a key"),
        ([0, 1, 3, 5, 9, 6, 10, 4, 5, 9], "is not a key"),
        ([0, 1, 3, 5, 9, 6, 10, 4, 5, 6, 99], "outside the vocabulary"),
    ],
)
def test_malformed_token_sequences_raise(tokens, message):
    # M = 4 keys (ids 5..8), R = 4 values (ids 9..12)
    with pytest.raises(ValueError, match=message):
        task.answer(tokens, 4, 4)


def test_score_and_chance():
    instances = task.generate(TaskSpec(3, 2, 2, 4), 10, seed=1)
    right = [inst.answer for inst in instances]
    assert task.score(right, instances).accuracy == 1.0
    wrong = [task.Vocabulary(2, 4).key(0)] * 10
    s = task.score(wrong, instances)
    assert s.correct == 0 and s.chance == pytest.approx(0.5 + 0.5 / 4)
    with pytest.raises(ValueError, match="3 predictions for 10 instances"):
        task.score(right[:3], instances)


def test_parity_blind_predictor_is_at_the_chance_level():
    spec = TaskSpec(5, 3, 5, 3)
    instances = task.generate(spec, 4000, seed=2)
    slot0 = [inst.vocab.value(inst.values[inst.keys.index(inst.queries[0])]) for inst in instances]
    s = task.score(slot0, instances)
    assert abs(s.accuracy - s.chance) < 0.03
    assert np.isclose(s.chance, 2 / 3)
