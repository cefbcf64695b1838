"""The pure-GDN lower bound for PCR-S: its lemmas (Z3, exhaustive), each shown able to fail; the hand-built pure-GDN
memory (exact within its slots, failing beyond); the string-task adversary at fixed-point and float caches."""

import math

import pytest

from lumotree.expressivity import adversary, lower_bound, string_memory, string_task
from lumotree.expressivity.string_task import StringTaskSpec


def test_lemmas_are_proved():
    for check in (lower_bound.prove_fooling_lemma, lower_bound.prove_pigeonhole,
                  lower_bound.prove_transition_spectrum):
        report = check()
        assert report.status == "proved", report.details
    assert lower_bound.check_fooling_set(3, 4, 2, 2).details["pairs"] == 2 * 16 * 15 // 2
    assert lower_bound.prove_transition_spectrum(beta_max=1.01).status == "refuted"  # past 1 a flip exists


def test_fooling_set_check_fails_on_a_wrong_query_choice(monkeypatch):
    monkeypatch.setattr(lower_bound, "distinguishing_queries", lambda keys, j, parity: (keys[0], keys[1]))
    assert lower_bound.check_fooling_set(2, 3, 2, 2).status == "refuted"


def test_prefix_classes_brute_force_equals_the_formula_and_can_disagree(monkeypatch):
    assert lower_bound.check_prefix_classes().status == "proved"
    assert lower_bound.count_prefix_classes(1, 2, 1, 2) == 4  # m = 2: the parity only swaps the two slots
    monkeypatch.setattr(lower_bound, "prefix_class_count",
                        lambda m, L, R: math.comb(2**L, m) * (2 * R**m - R))  # the m >= 3 formula everywhere
    assert lower_bound.check_prefix_classes().status == "refuted"


def test_pigeonhole_threshold():
    assert lower_bound.pigeonhole_threshold(1000, 16)["pairs"] == 251  # 251 * 4 > 1000 >= 250 * 4
    t = lower_bound.pigeonhole_threshold(832, 3)
    assert 3 ** t["pairs"] > 2**832 >= 3 ** (t["pairs"] - 1) and t["key_length"] == math.ceil(math.log2(t["pairs"]))
    with pytest.raises(ValueError, match="num_values = 1"):
        lower_bound.pigeonhole_threshold(10, 1)
    log = lower_bound.log_precision_threshold(312, 1.0)
    assert log["found"] and log["holds_beyond"] and log["pairs"] * 1.0 > 312 * math.log2(log["length"])


def test_hand_built_memory_is_exact_within_its_slots_and_fails_beyond():
    memory = string_memory.build_string_memory(3, slot_bits=2)
    for L, m in ((1, 2), (2, 4)):
        instances = string_task.generate(StringTaskSpec(4, m, L, 3), 12, seed=L)
        assert string_task.score(string_memory.predict(memory, instances), instances).accuracy == 1.0
    longer = string_task.generate(StringTaskSpec(4, 6, 3, 3), 40, seed=3)
    assert string_task.score(string_memory.predict(memory, longer), longer).accuracy < 1.0


@pytest.mark.parametrize("precision", ["fx16.8", "bf16"])
def test_adversary_breaks_the_memory_within_the_bound(precision):
    memory = string_memory.build_string_memory(3, slot_bits=2).model
    report = adversary.string_attack(memory, precision, 3, key_length=3)
    assert report["found"] and report["within_bound"]
    assert report["counterexample"]["pairs"] <= report["counting"]["pairs_for_a_collision"]
    if report["counterexample"]["strategy"] == "forgetting":
        assert report["counterexample"]["logits_bitwise_equal"]


def test_adversary_on_a_random_pure_gdn_with_a_fixed_point_cache():
    model = adversary.random_pure_gdn(3, 4, hidden_size=16, layers=1, heads=1, head_dim=4, seed=2)
    runner = adversary.RoundedRunner(model, "fx12.4")
    assert runner.state_bits() == 12 * sum(c.conv_state.size + c.state.size for c in model.new_cache().layers)
    found = adversary.string_forgetting_search(runner, 4, 4, seed=1)
    assert found is not None and found.verified and found.first.key_length == 4
    birthday = adversary.string_birthday_search(runner, 3, 4, pairs=5, samples=300, seed=1)
    assert birthday is not None and birthday.verified


def test_rounding_formats_and_errors():
    assert list(adversary.round_to([0.3, 1000.0], "fx8.2")) == [0.25, 31.75]
    assert adversary.precision_bits("fx20.10") == 20 and adversary.precision_bits("bf16") == 16
    with pytest.raises(ValueError, match="'fx<bits>.<frac_bits>'"):
        adversary.round_to([1.0], "int8")
    with pytest.raises(ValueError, match="string task's"):
        adversary.string_attack(adversary.random_pure_gdn(1, 2, hidden_size=8, head_dim=2), "bf16", 4, 3)
