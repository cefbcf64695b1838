"""PCR-S, the string-key task: exact answers against a brute-force oracle, parsing round trips, the generator, and
clear errors on bad input."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lumotree.expressivity import string_task
from lumotree.expressivity.string_task import StringInstance, StringTaskSpec, StringVocabulary


def oracle(tokens, num_values):
    """Brute force on token names: split on values, count ones, look the selected query string up."""
    vocab = StringVocabulary(num_values)
    names = [vocab.name(t) for t in tokens]
    sep, qm, comma = names.index("<sep>"), names.index("?"), names.index(",")
    parity = names[1:sep].count("1") % 2
    queries = ["".join(names[qm + 1 : comma]), "".join(names[comma + 1 :])]
    key = ""
    for name in names[sep + 1 : qm]:
        if name in ("a", "b"):
            key += name
        else:
            if key == queries[parity]:
                return next(t for t in range(vocab.size) if vocab.name(t) == name)
            key = ""
    raise AssertionError("query not found")


specs = st.integers(1, 6).flatmap(lambda L: st.builds(
    lambda n, m, R: StringTaskSpec(n, m, L, R), st.integers(1, 30), st.integers(2, min(8, 2**L)), st.integers(1, 7)))


@settings(max_examples=60)
@given(spec=specs, seed=st.integers(0, 2**32 - 1))
def test_answer_matches_oracle_and_parse_round_trips(spec, seed):
    for inst in string_task.generate(spec, 4, seed=seed):
        tokens = inst.tokens
        assert len(tokens) == spec.length
        assert string_task.answer(tokens, spec.num_values) == oracle(tokens, spec.num_values) == inst.answer
        assert string_task.parse(tokens, spec.num_values) == inst
        assert len(set(inst.keys)) == spec.m and all(len(k) == spec.key_length for k in inst.keys)
        assert inst.tokens[inst.prefix_length] == string_task.QUERY


def test_long_keys_and_the_key_numbering():
    assert string_task.key_string(5, 4) == "abab" and string_task.key_number("abab") == 5
    inst = string_task.generate(StringTaskSpec(3, 5, 80, 3), 1, seed=0)[0]  # 2^80 keys: rejection sampling
    assert inst.key_length == 80 and len(set(inst.keys)) == 5
    a, b = (string_task.generate(StringTaskSpec(4, 4, 3, 5), 50, seed=s) for s in (7, 7))
    assert a == b and {i.parity for i in a} == {0, 1}


def test_render_and_parity():
    inst = StringInstance((1, 0, 1), ("ab", "ba", "bb"), (4, 5, 6), ("ba", "bb"), 7)
    assert inst.parity == 0 and inst.answer_index == 5
    assert inst.render() == "<bos> 1 0 1 <sep> ab V4 ba V5 bb V6 ? ba , bb"
    assert StringInstance((1,), ("ab", "ba"), (0, 1), ("ab", "ba"), 2).answer_index == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (((1,), ("ab", "b"), (0, 0), ("ab", "b")), "different lengths"),
        (((1,), ("ab", "ab"), (0, 0), ("ab", "ab")), "not distinct"),
        (((1,), ("ab", "ba"), (0, 0), ("ab", "bb")), "q_1 = 'bb' is not among the keys"),
        (((1,), ("ab", "ca"), (0, 0), ("ab", "ca")), "over {a, b}"),
        (((), ("ab", "ba"), (0, 0), ("ab", "ba")), "n = 0"),
        (((1,), ("ab", "ba"), (0, 9), ("ab", "ba")), r"values \[9\]"),
    ],
)
def test_bad_instances_raise_clear_errors(args, message):
    with pytest.raises(ValueError, match=message):
        StringInstance(*args, num_values=3)


def test_bad_specs_raise_clear_errors():
    with pytest.raises(ValueError, match="only 2\\^2 = 4 keys"):
        StringTaskSpec(3, 5, 2, 3)
    with pytest.raises(ValueError, match="key_length = 0 must be >= 1"):
        StringTaskSpec(3, 2, 0, 3)


@pytest.mark.parametrize(
    "tokens, message",
    [
        ([1, 3, 5, 8, 6, 9, 4, 5, 7, 6], "starts with BOS"),
        ([0, 1, 3, 5, 8, 6, 9, 5, 7, 6], "no '\\?'"),
        ([0, 1, 3, 8, 6, 9, 4, 6, 7, 6], "has no key before it"),
        ([0, 1, 3, 5, 8, 6, 4, 5, 7, 6], "before '\\?' has no value"),
        ([0, 1, 3, 5, 8, 6, 9, 4, 5, 6], "exactly one comma"),
        ([0, 1, 3, 5, 8, 6, 9, 4, 5, 7, 8], "is not a key letter"),
        ([0, 1, 3, 5, 8, 6, 9, 4, 5, 7, 99], "outside the vocabulary"),
    ],
)
def test_malformed_token_sequences_raise(tokens, message):
    # R = 3: values are 8, 9, 10
    with pytest.raises(ValueError, match=message):
        string_task.answer(tokens, 3)


def test_parity_blind_predictor_is_at_chance():
    instances = string_task.generate(StringTaskSpec(5, 4, 3, 3), 3000, seed=2)
    slot0 = [inst.vocab.value(inst.values[inst.keys.index(inst.queries[0])]) for inst in instances]
    s = string_task.score(slot0, instances)
    assert abs(s.accuracy - s.chance) < 0.03 and np.isclose(s.chance, 2 / 3)
