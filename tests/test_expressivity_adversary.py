"""The pure-GDN adversary: rounding, verified counterexamples on small models, refusal of non-counterexamples, and
the counting bound."""

import numpy as np
import pytest

from lumotree.expressivity import adversary, hybrid
from lumotree.expressivity.task import Instance


@pytest.fixture(scope="module")
def tiny():
    return adversary.random_pure_gdn(12, 6, hidden_size=16, layers=1, heads=1, head_dim=4, seed=3)


def test_round_to_formats():
    x = np.array([0.1234, 1000.0, -1e6, 3.14159])
    assert np.array_equal(adversary.round_to(x, "fp8"), [0.125, 448.0, -448.0, 3.25])  # saturating e4m3
    assert adversary.round_to(x, "fp16")[2] == -65504.0
    assert adversary.round_to(x, "bf16")[0] == pytest.approx(0.1235, abs=1e-3)
    with pytest.raises(ValueError, match="precision = 'int4'"):
        adversary.round_to(x, "int4")


def test_attack_finds_a_verified_counterexample(tiny):
    report = adversary.attack(tiny, "fp8", 12, 6, birthday_samples=200)
    assert report["found"]
    ce = report["counterexample"]
    assert ce["verified"] and ce["logits_bitwise_equal"]
    assert ce["answers"][0] != ce["answers"][1]
    assert ce["predictions"][0] == ce["predictions"][1]
    assert len(ce["wrong_on"]) >= 1
    assert ce["first"][-5:] == ce["second"][-5:]  # the same query suffix


def test_birthday_search_on_a_tiny_state(tiny):
    runner = adversary.RoundedRunner(tiny, "fp8")
    found = adversary.birthday_search(runner, 12, 6, pairs=6, samples=400, seed=1)
    assert found is not None and found.verified
    assert found.first.values != found.second.values


def test_verification_rejects_inputs_whose_caches_differ(tiny):
    runner = adversary.RoundedRunner(tiny, "fp32")
    first = Instance((1, 0), (0, 1), (0, 2), (1, 0), 12, 6)  # parity 1: asks K0
    second = Instance((1, 0), (0, 1), (1, 2), (1, 0), 12, 6)  # differs at K0 right before the query region
    ce = adversary.verify_counterexample(runner, adversary.Counterexample(first, second, "manual", 2))
    assert not ce.verified
    same = Instance((1, 0), (0, 1), (0, 3), (1, 0), 12, 6)
    with pytest.raises(ValueError, match="same answer"):
        adversary.verify_counterexample(runner, adversary.Counterexample(first, same, "manual", 2))


def test_counting_bound():
    bound = adversary.counting_bound(1000, 16)
    assert bound["pairs_for_a_collision"] == 251  # 251 * 4 bits > 1000
    runner = adversary.RoundedRunner(adversary.random_pure_gdn(8, 4, hidden_size=8, head_dim=2), "bf16")
    cache = runner.new_cache()
    numbers = sum(layer.conv_state.size + layer.state.size for layer in cache.layers)
    assert runner.state_bits() == 16 * numbers


def test_adversary_needs_a_pure_gdn_model():
    with pytest.raises(ValueError, match="pure-GDN"):
        adversary.RoundedRunner(hybrid.build_hybrid(4, 4).model, "bf16")
