"""The hybrid construction through the reference model (chain and tree paths), its proof parts (each shown able to
fail), the beta < 1 ablation, and the pure-attention scratchpad construction. Small n and m only."""

from fractions import Fraction

import numpy as np
import pytest

from lumotree.expressivity import hybrid, proof, scratchpad, task
from lumotree.expressivity.task import Instance, TaskSpec


@pytest.fixture(scope="module")
def construction():
    return hybrid.build_hybrid(5, 4)


@pytest.fixture(scope="module")
def ablated():
    return hybrid.build_hybrid(5, 4, reflection_beta=0.9)


def test_hybrid_is_exact_on_random_instances(construction):
    instances = []
    for n, m in [(1, 2), (2, 3), (7, 5), (12, 4), (33, 5)]:
        instances += task.generate(TaskSpec(n, m, 5, 4), 12, seed=n)
    assert task.score(hybrid.predict(construction, instances), instances).accuracy == 1.0


def test_hybrid_logits_have_the_stated_structure(construction):
    inst = task.generate(TaskSpec(9, 4, 5, 4), 1, seed=5)[0]
    logits = hybrid.final_logits(construction.model, inst.tokens)
    vocab = inst.vocab
    others = [t for t in range(vocab.size) if not vocab.is_value(t)]
    assert np.all(logits[others] == 0.0)  # only value tokens get a logit
    assert logits[inst.answer] > 0 and np.sort(logits)[-2] < 1e-20 * logits[inst.answer]


def test_tree_path_equals_chain_path(construction):
    inst = task.generate(TaskSpec(6, 4, 5, 4), 1, seed=11)[0]
    tree_logits, pairs = hybrid.tree_predictions(construction, inst)
    leaves = 0
    for node, (q0, q1) in enumerate(pairs):
        if q0 < 0:
            continue
        full = Instance(inst.bits, inst.keys, inst.values, (q0, q1), 5, 4)
        chain = hybrid.final_logits(construction.model, full.tokens, chunk=3)
        assert np.allclose(chain, tree_logits[node], rtol=0, atol=1e-9)
        assert int(np.argmax(tree_logits[node])) == full.answer
        leaves += 1
    assert leaves == 4 * 3


def test_exact_parity_readout_sign_is_the_running_parity(construction):
    inst = task.generate(TaskSpec(10, 3, 5, 4), 1, seed=3)[0]
    readout = hybrid.exact_parity_readout(construction, inst.tokens)
    assert all(isinstance(x, Fraction) for x in readout)
    running = np.concatenate([[0], np.cumsum(inst.bits) % 2])
    for t, p in enumerate(running):
        assert (readout[t] < 0) == bool(p) and readout[t] != 0
    assert all((x < 0) == bool(running[-1]) for x in readout[len(running):])


def test_parity_invariant_proved_and_ablation_never_flips(construction, ablated):
    assert proof.prove_parity_invariant(construction).status == "proved"
    assert proof.prove_parity_invariant(ablated, expect_flip=False).status == "proved"
    refuted = proof.prove_parity_invariant(ablated, expect_flip=True)
    assert refuted.status == "refuted" and refuted.details["bit1"]["status"] == "refuted"


def test_exhaustive_parity_tree_proves_and_refutes(construction, ablated):
    good = proof.exhaustive_parity_tree(construction, 5)
    assert good.status == "proved" and good.details["bit_strings"] == 62
    bad = proof.exhaustive_parity_tree(ablated, 5)
    assert bad.status == "refuted" and sum(bad.details["counterexample"]["bits"]) % 2 == 1


def test_symmetry_check_detects_a_broken_weight(construction):
    assert proof.check_symmetry(construction, trials=2).status == "proved"
    broken = hybrid.build_hybrid(5, 4)
    broken.model.weights.embed_tokens[broken.vocab.key(2), broken.layout.KEY + 2] = 1.5
    result = proof.check_symmetry(broken, trials=2)
    assert result.status == "refuted" and result.details["weight"] == "embed_tokens"


def test_exhaustive_retrieval_and_margin(construction):
    retrieval = proof.exhaustive_retrieval(construction, n_max=3, m_max=3)
    assert retrieval.status == "proved"
    d = retrieval.details
    assert d["chain_cases"] == d["tree_cases"] > 0
    assert d["logit_gap_min"] == pytest.approx(hybrid.LOGIT_MARGIN, abs=1e-3)
    margin = proof.prove_margin(3 + 2 * 3 + 5, d["logit_gap_min"], d["right_value_min"], d["other_value_abs_max"])
    assert margin.status == "proved"
    too_small = proof.prove_margin(40, 1.0, d["right_value_min"], d["other_value_abs_max"])
    assert too_small.status == "refuted"


def test_canonical_regions_count_set_partitions():
    regions = proof.canonical_regions(4, 4)
    assert [len([r for r in regions if len(r[0]) == m]) for m in (2, 3, 4)] == [2, 5, 15]  # Bell numbers
    assert len([r for r in proof.canonical_regions(4, 2) if len(r[0]) == 4]) == 8  # at most 2 blocks


def test_exp_neg_upper_bound_is_an_upper_bound():
    for delta in (Fraction(1, 2), Fraction(5), Fraction(64)):
        eps = proof.exp_neg_upper_bound(delta)
        assert eps >= Fraction(np.exp(-float(delta))) * (1 - Fraction(1, 10**12))
        assert eps < Fraction(np.exp(-float(delta))) * (1 + Fraction(1, 10**6))


def test_ablation_falls_to_chance(ablated):
    instances = task.generate(TaskSpec(6, 3, 5, 4), 300, seed=8)
    predictions = hybrid.predict(ablated, instances)
    s = task.score(predictions, instances)
    assert s.accuracy < s.chance + 0.09
    slot0 = [inst.vocab.value(inst.values[inst.keys.index(inst.queries[0])]) for inst in instances]
    assert np.mean(np.asarray(predictions) == np.asarray(slot0)) > 0.9  # it answers q_0's value: parity-blind


def test_construction_input_errors(construction):
    with pytest.raises(ValueError, match="reflection_beta = 2.5"):
        hybrid.build_hybrid(4, 4, reflection_beta=2.5)
    with pytest.raises(ValueError, match="num_keys = 1"):
        hybrid.build_hybrid(1, 4)
    other = task.generate(TaskSpec(3, 2, 6, 4), 1, seed=0)
    with pytest.raises(ValueError, match="built for M = 5"):
        hybrid.predict(construction, other)


@pytest.fixture(scope="module")
def pad():
    return scratchpad.build_scratchpad(4, 4, max_length=128)


@pytest.mark.parametrize("n", [1, 3, 10])
def test_scratchpad_writes_running_parity_then_answers(pad, n):
    for inst in task.generate(TaskSpec(n, 3, 4, 4), 3, seed=n):
        run = scratchpad.generate(pad, inst)
        assert run.correct and run.parities_right
        assert len(run.scratchpad) == n


def test_scratchpad_refuses_inputs_beyond_its_hash_range(pad):
    inst = task.generate(TaskSpec(70, 2, 4, 4), 1, seed=0)[0]
    with pytest.raises(ValueError, match="exceeds max_length = 128"):
        scratchpad.generate(pad, inst)


def test_hybrid_runs_through_the_optimized_kernels():
    from lumotree.expressivity.check import optimized_path

    result = optimized_path(1, seed=0)
    assert result["prefill_accuracy"] == 1.0 and result["tree_accuracy"] == 1.0
    assert result["max_abs_logit_difference_vs_reference"] < 1e-4


def test_cli_sample(capsys):
    from lumotree.cli import main as cli_main

    assert cli_main(["expressivity", "sample", "--n", "5", "--m", "3", "--keys", "4", "--values", "3"]) == 0
    out = capsys.readouterr().out
    answer = next(line for line in out.splitlines() if line.startswith("answer")).split()[-1]
    predicted = next(line for line in out.splitlines() if line.startswith("hybrid")).split()[-1]
    assert answer == predicted
