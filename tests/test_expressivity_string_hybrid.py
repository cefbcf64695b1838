"""The fixed-width PCR-S hybrid through the reference model (chain and tree paths, float64 and p-bit caches), its
gates as documented, and its proof parts, each shown able to fail."""

import numpy as np
import pytest

from lumotree.expressivity import separation, string_hybrid, string_proof, string_task
from lumotree.expressivity.string_task import StringInstance, StringTaskSpec
from lumotree.reference.fixedpoint import FixedFormat


@pytest.fixture(scope="module")
def construction():
    return string_hybrid.build_string_hybrid(4, max_key_length=12)


def test_width_does_not_depend_on_key_length_or_pairs():
    sizes = {string_hybrid.build_string_hybrid(4, L).model.config.hidden_size for L in (1, 8, 30)}
    assert sizes == {20 + 2 * 4}


def test_exact_on_random_instances(construction):
    instances = []
    for n, m, L in [(1, 2, 1), (3, 4, 2), (9, 8, 3), (20, 16, 7), (7, 12, 12)]:
        instances += string_task.generate(StringTaskSpec(n, m, L, 4), 6, seed=n + L)
    assert string_task.score(string_hybrid.predict(construction, instances), instances).accuracy == 1.0


def test_hardest_keys_need_the_logit_scale_of_their_length(construction):
    assert separation.near_key_accuracy(construction, 12) == 1.0
    too_coarse = string_hybrid.build_string_hybrid(4, max_key_length=2)  # margin sized for 2-letter keys only
    assert separation.near_key_accuracy(too_coarse, 12) < 1.0


def test_gates_are_exact_as_documented(construction):
    encode = string_proof.kind_inputs(construction, string_hybrid.ENCODE_HEAD)
    for kind, (q, k, v, alpha, beta) in encode.items():
        assert list(k) == [1, 0] and list(q) == [1, 0]
        if kind in ("a", "b"):
            assert alpha[0] == 1 and beta[0] == 0.5 and list(v) == [64 if kind == "b" else 0, 64, 0]
        else:
            assert alpha[0] == 0 and beta[0] == 1 and list(v) == [0, 64, 0]
    parity = string_proof.kind_inputs(construction, string_hybrid.PARITY_HEAD)
    assert parity["bit1"][4][0] == 2 and all(parity[k][3][0] == 1 for k in parity)


def test_tree_path_equals_chain_path(construction):
    inst = string_task.generate(StringTaskSpec(5, 3, 3, 4), 1, seed=4)[0]
    tree_logits, pairs = string_hybrid.tree_predictions(construction, inst)
    leaves = 0
    for node, (q0, q1) in enumerate(pairs):
        if q0:
            full = StringInstance(inst.bits, inst.keys, inst.values, (q0, q1), 4)
            chain = string_hybrid.final_logits(construction.model, full.tokens, chunk=5)
            assert np.allclose(chain, tree_logits[node], rtol=0, atol=1e-9)
            assert int(np.argmax(tree_logits[node])) == full.answer
            leaves += 1
    assert leaves == 3 * 2


def test_cache_precision_decides():
    table = separation.cache_precision([4], 4)
    row = table["rows"][0]
    assert row["frac_bits"] >= 4 and row["fails_one_bit_below"]  # right at fx<10+f>.<f>, wrong one bit below
    instances = separation.near_instances(4, 4, pairs_limit=2)
    model = string_hybrid.build_string_hybrid(4, 4)
    assert separation.right_at_precision(model, instances, FixedFormat(40, 30))
    assert not separation.right_at_precision(model, instances, FixedFormat(12, 2))


def test_beta_at_most_one_is_parity_blind():
    ablated = string_hybrid.build_string_hybrid(4, 8, reflection_beta=0.9)
    assert string_proof.prove_parity(ablated, expect_flip=False).status == "proved"
    assert string_proof.prove_parity(ablated, expect_flip=True).status == "refuted"
    instances = string_task.generate(StringTaskSpec(6, 3, 3, 4), 200, seed=1)
    predictions = string_hybrid.predict(ablated, instances)
    slot0 = [i.vocab.value(i.values[i.keys.index(i.queries[0])]) for i in instances]
    assert np.mean(np.asarray(predictions) == np.asarray(slot0)) > 0.9


def test_proof_parts(construction):
    assert string_proof.prove_parity(construction).status == "proved"
    encoding = string_proof.prove_encoding(construction)
    assert encoding.status == "proved" and encoding.details["G_is_64"]
    assert string_proof.exhaustive_encoding_tree(construction, 6).status == "proved"
    assert string_proof.check_angle_gap(8).status == "proved"
    retrieval = string_proof.exhaustive_retrieval(construction, (1, 2), 3, ((1,), (1, 1)))
    assert retrieval.status == "proved" and retrieval.details["chain_cases"] == retrieval.details["tree_cases"] > 100
    assert string_proof.fixed_point_parity(construction, FixedFormat(12, 3)).status == "proved"
    fx = string_proof.fixed_point_encoding(construction, FixedFormat(12, 1), 8)
    assert fx.details["exact_up_to"] == 7 and fx.details["distinct_per_length"][8] < 256  # f + 6 letters, no more


def test_proof_parts_fail_on_broken_weights():
    broken = string_hybrid.build_string_hybrid(4, 8)
    mixer = broken.model.weights.layers[0].mixer
    mixer.in_proj_ba[2, broken.layout.T_LA] *= 1.01  # rows b_0, a_0, b_1, a_1: the encode head's beta on 'a' moves
    assert string_proof.prove_encoding(broken).status == "refuted"
    assert string_proof.exhaustive_encoding_tree(broken, 4).status == "refuted"
    swapped = string_hybrid.build_string_hybrid(4, 8)
    k_proj = swapped.model.weights.layers[2].mixer.k_proj
    rd = swapped.model.config.attention_spec().rotary_dim
    k_proj[[rd, rd + 1]] = k_proj[[rd + 1, rd]]  # keys encoded as (c, x): the match moves
    assert string_proof.exhaustive_retrieval(swapped, (2,), 3, ((1,),)).status == "refuted"
    assert string_proof.fixed_point_parity(broken, FixedFormat(10, 2)).status == "refuted"  # 2s overflows


def test_input_errors(construction):
    with pytest.raises(ValueError, match="max_key_length = 0"):
        string_hybrid.build_string_hybrid(4, 0)
    with pytest.raises(ValueError, match="reflection_beta = 1.5"):
        string_hybrid.build_string_hybrid(4, 4, reflection_beta=1.5)
    other = string_task.generate(StringTaskSpec(3, 2, 2, 5), 1, seed=0)
    with pytest.raises(ValueError, match="built for R = 4"):
        string_hybrid.predict(construction, other)
