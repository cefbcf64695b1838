"""The mutation suite: every fault of tests/faults.py, planted alone in the reference's source, is killed (refuted,
with a counterexample) by each check of ``lumotree prove --quick`` that covers it, run in-process.

Kill rate 100% means every parametrized ``test_fault_is_killed`` passes. The faults stand for the classes of mistake
a kernel author makes (``faults.SHARED``, ``TRANSPOSE``, ``OUTSIDE``, ``PAST_SCOPE``, ...); see docs/proofs.md.
"""

from __future__ import annotations

import inspect
from fractions import Fraction

import numpy as np
import pytest
from faults import (FAULTS, INDEX, LOSSLESS, OFF_BY_ONE, OUTSIDE, PAST_SCOPE, SCHEDULE, SHARED, TRANSPOSE, Edit, Fault,
                    install)

from lumotree.proofs import REGISTRY, run_check, select_checks
from lumotree.reference import gdn
from lumotree.reference.tree import TokenTree

BY_NAME = {fault.name: fault for fault in FAULTS}


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_fault_is_killed(name, monkeypatch):
    fault = BY_NAME[name]
    install(fault, monkeypatch)
    for killer in fault.killers:
        result = run_check(killer, quick=True)
        assert result.status == "refuted", f"{name} survives {killer}: {result.status} ({result.detail})"
        assert not result.ok and result.counterexample, result


def test_the_suite_covers_every_class_of_mistake_with_at_least_thirty_faults():
    assert len(FAULTS) >= 30 and len(BY_NAME) == len(FAULTS)
    assert {fault.mistake for fault in FAULTS} == {SHARED, TRANSPOSE, OUTSIDE, PAST_SCOPE, OFF_BY_ONE, SCHEDULE,
                                                   LOSSLESS, INDEX}
    select_checks()
    killers = {killer for fault in FAULTS for killer in fault.killers}
    assert killers <= set(REGISTRY) and all(REGISTRY[k].expected != "refuted" for k in killers)
    # every check that runs the reference code kills at least one fault; induction/sympy proves the rules themselves
    # (block symbols, no reference code) and lossless/lossy-residual is the deliberately wrong verifier
    untested = set(REGISTRY) - killers - {"induction/sympy", "lossless/lossy-residual"}
    assert not untested, untested


def test_a_fault_whose_snippet_is_gone_fails_loudly(monkeypatch):
    """A fault cannot silently stop applying: an edit must find its snippet exactly as often as stated."""
    stale = Fault("stale", OFF_BY_ONE, "a snippet the reference no longer has",
                  (Edit("gdn.commit", "no such code", ""),), ("commit/sympy",))
    with pytest.raises(AssertionError, match="occurs 0 times"):
        install(stale, monkeypatch)


def test_install_replaces_every_binding_and_monkeypatch_restores_them():
    from lumotree.reference import attention, tree

    original = tree.node_position
    with pytest.MonkeyPatch.context() as patch:
        install(BY_NAME["position-one-past"], patch)
        assert tree.node_position(3, 2) == 6 and attention.node_position is tree.node_position
    assert tree.node_position is original and attention.node_position is original
    assert "return prefix_len + depth\n" in inspect.getsource(tree.node_position)


def test_counterexamples_are_concrete(monkeypatch):
    """A refutation carries exact inputs on which the two sides really differ."""
    install(BY_NAME["output-mask-exclusive"], monkeypatch)
    example = run_check("closed-form/sympy", quick=True).counterexample
    x = {name: np.vectorize(Fraction, otypes=[object])(np.array(v, dtype=object)) if isinstance(v, list)
         else Fraction(v) for name, v in example["inputs"].items()}
    tree = TokenTree(example["tree"])
    args = (x["q"], x["k"], x["v"], x["alpha"], x["beta"], x["S0"])
    o_closed, _ = gdn.tree_closed_form(*args, tree, scale=x["scale"])
    o_recurrent, _ = gdn.tree_recurrent(*args, tree, scale=x["scale"])
    assert (o_closed != o_recurrent).any() and example["tree_closed_form"] != example["tree_recurrent"]


def test_symbolic_lossless_counterexample_is_a_distribution_where_the_rule_fails(monkeypatch):
    """lossless/symbolic gives the target and draft at the node (a point of the region Z3 found)."""
    from lumotree.reference import verify

    install(BY_NAME["accept-with-joint-probability"], monkeypatch)
    example = run_check("lossless/symbolic", quick=True).counterexample
    rows = {name: [Fraction(v) for v in row] for name, row in example["distributions at the node"].items()}
    target_row, draft_row = rows["target[0]"], rows["draft[0]"]
    vocab = len(target_row)
    uniform = [Fraction(1, vocab)] * vocab
    step = verify.step_distribution((0,), lambda c: target_row if tuple(c) == (0,) else uniform,
                                    lambda c: draft_row if tuple(c) == (0,) else uniform, example["template"],
                                    example["variant"])
    first = example["emitted"][0]
    assert sum(p for emitted, p in step.items() if emitted[0] == first) != target_row[first]


def test_the_symbolic_sweep_refutes_the_lossy_verifier_at_vocabulary_three():
    """At vocabulary 2 the residual after a rejection is a point mass and the lossy verifier is lossless; at 3 the
    symbolic sweep finds the region where it is not, with a distribution in it."""
    from lumotree.proofs.lossless_symbolic import prove_template
    from lumotree.reference import verify

    lossy = "verify_sampling_lossy_unnormalised_residual"
    assert prove_template(verify, (-1, 0, 0), 2, "iid", lossy)[0] == "proved"
    status, _, example = prove_template(verify, (-1, 0, 0), 3, "iid", lossy)
    assert status == "refuted" and example["distributions at the node"]
