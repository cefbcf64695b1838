"""The GDN tree op's public API (``lumotree.optimized.gdn_tree_verify`` / ``gdn_tree_commit``): every path it can
dispatch to computes the tree's outputs and commits against the float64 references, in place and deferred.

CPU: the Triton interpreter on tiny shapes, where the deferred path is the portable pipeline behind a flush (the
fused sm_90 kernel has its own tests in ``test_gdn_fused.py``, and a GPU test here checks the dispatch there).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import trees
from test_gdn_kernels import make_case, rel_err

import lumotree.optimized as lo
from lumotree.optimized.ops.gdn_tree import fused_preferred, gates
from lumotree.optimized.ops.gdn_tree import reference as R

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def float64_step(case, accepted, *, l2norm=True):
    """The closed form's outputs and the committed states of ``case``'s trees, in float64."""
    args = [case[n].double() for n in ("q", "k", "v", "a", "b")]
    pool64 = torch.nan_to_num(case["pool"].double())
    o, f = R.gdn_tree_closed_form_ref(*args, pool64, case["slots"], case["parents"], num_nodes=case["num_nodes"],
                                      use_qk_l2norm_in_kernel=l2norm)
    states = R.gdn_tree_commit_ref(pool64, case["slots"], f, case["parents"], accepted, num_nodes=case["num_nodes"])
    return o, states


def real_rows(t, num_nodes):
    return torch.cat([t[b, : int(n)] for b, n in enumerate(num_nodes)])


@settings(max_examples=6, deadline=None)
@given(rows=st.lists(trees(max_nodes=9), min_size=1, max_size=3), group=st.sampled_from([1, 2]),
       deferred=st.booleans(), seed=st.integers(0, 2**16))
def test_verify_and_commit_match_float64_in_place_and_deferred(rows, group, deferred, seed):
    """One step through the public API, ``pending`` or not: outputs, and the states the next reader sees (after a
    flush when deferred), against the float64 closed form and commit."""
    case = make_case(rows, H=1, group=group, seed=seed, device=DEVICE)
    accepted = torch.tensor([len(r) - 1 for r in rows], dtype=torch.int32, device=DEVICE)  # the deepest last node
    want_o, want_states = float64_step(case, accepted)  # before the commit writes the pool
    pool = case["pool"]
    pending = lo.pending_commits(pool, 1) if deferred else None
    kw = dict(parents=case["parents"], initial_state=pool, state_indices=case["slots"], num_nodes=case["num_nodes"])
    o, factors = lo.gdn_tree_verify(case["q"], case["k"], case["v"], case["a"], case["b"],
                                    use_qk_l2norm_in_kernel=True, pending=pending, **kw)
    lo.gdn_tree_commit(factors, accepted, pending=pending, **kw)
    if deferred:
        lo.gdn_tree_flush(pending, pool, case["slots"])
    assert rel_err(real_rows(o, case["num_nodes"]), real_rows(want_o, case["num_nodes"])) < 1e-5
    tol = 2e-3 if deferred else 1e-5  # a record holds its operands rounded to tf32
    assert rel_err(pool[case["slots"]], want_states) < tol


def test_two_deferred_steps_equal_two_in_place_steps():
    """The second deferred verify applies the first step's record before it reads the state: its outputs are the
    in-place pipeline's second outputs (to the record's tf32 rounding), and both leave the same states."""
    rows = [[-1, 0, 1, 1, 3], [-1, 0, 0]]
    first, second = make_case(rows, H=2, group=2, seed=3, device=DEVICE), make_case(rows, H=2, group=2, seed=4,
                                                                                    device=DEVICE)
    second["pool"], second["slots"] = first["pool"], first["slots"]
    accepted = torch.tensor([3, 2], dtype=torch.int32, device=DEVICE)
    results = {}
    for deferred in (False, True):
        pool = first["pool"].clone()
        pending = lo.pending_commits(pool, 2) if deferred else None
        outs = []
        for case in (first, second):
            kw = dict(parents=case["parents"], initial_state=pool, state_indices=case["slots"],
                      num_nodes=case["num_nodes"], pending=pending)
            o, f = lo.gdn_tree_verify(case["q"], case["k"], case["v"], case["a"], case["b"],
                                      use_qk_l2norm_in_kernel=True, **kw)
            lo.gdn_tree_commit(f, accepted, **kw)
            outs.append(real_rows(o, case["num_nodes"]))
        if deferred:
            assert int(pending.active[first["slots"]].sum()) > 0  # the second step's record waits in pending
            lo.gdn_tree_flush(pending, pool)
            assert int(pending.active.sum()) == 0
        results[deferred] = (outs, pool[first["slots"]])
    (o_in, s_in), (o_def, s_def) = results[False], results[True]
    assert torch.equal(o_in[0], o_def[0])  # nothing pending before the first step: the same kernels, bit for bit
    assert rel_err(o_def[1], o_in[1]) < 2e-3 and rel_err(s_def, s_in) < 2e-3


def test_raw_gates_equal_the_gates_computed_first():
    """With ``A_log`` and ``dt_bias`` the verify gates ``a`` and ``b`` in the kernel: the same as gating first
    (:func:`gates`, the fused path's) and passing ``g`` and ``beta``."""
    case = make_case([[-1, 0, 1, 0], [-1, 0]], H=1, group=2, gated=True, seed=5, device=DEVICE)
    kw = dict(parents=case["parents"], initial_state=case["pool"], state_indices=case["slots"],
              num_nodes=case["num_nodes"], use_qk_l2norm_in_kernel=True)
    o1, f1 = lo.gdn_tree_verify(case["q"], case["k"], case["v"], case["a"], case["b"], A_log=case["A_log"],
                                dt_bias=case["dt_bias"], allow_neg_eigval=True, **kw)
    g, beta = gates(case["a"], case["b"], case["A_log"], case["dt_bias"], True)
    o2, f2 = lo.gdn_tree_verify(case["q"], case["k"], case["v"], g, beta, **kw)
    n = case["num_nodes"]
    assert rel_err(real_rows(o1, n), real_rows(o2, n)) < 1e-6
    assert rel_err(real_rows(f1.delta, n), real_rows(f2.delta, n)) < 1e-6


def test_the_fused_path_is_taken_only_where_it_runs():
    """Off sm_90 (and for shapes or precisions the fused kernel does not take) the dispatch keeps the portable
    pipeline."""
    q = torch.zeros(8, 64, 16, 128, device=DEVICE)
    v = torch.zeros(8, 64, 32, 128, device=DEVICE)
    pool = torch.zeros(8, 32, 128, 128, device=DEVICE)
    on_hopper = DEVICE == "cuda" and torch.cuda.get_device_capability() == (9, 0)
    assert fused_preferred(q, q, v, pool, None) == on_hopper
    assert not fused_preferred(q, q, v, pool, "ieee")  # the fused kernel runs in tf32 only
    assert not fused_preferred(q[:, :32], q[:, :32], v[:, :32], pool, None)  # 64-node trees only
    assert not fused_preferred(q[:1], q[:1], v[:1], pool, None)  # a batch of one: the portable pipeline is faster
    assert not fused_preferred(q.bfloat16(), q.bfloat16(), v.bfloat16(), pool, None)  # fp32 inputs only


def test_bad_arguments_name_themselves():
    case = make_case([[-1, 0]], seed=1, device=DEVICE)
    kw = dict(parents=case["parents"], initial_state=case["pool"], state_indices=case["slots"])
    args = (case["q"], case["k"], case["v"], case["a"], case["b"])
    with pytest.raises(ValueError, match="input_precision"):
        lo.gdn_tree_verify(*args, input_precision="fp8", **kw)
    with pytest.raises(ValueError, match=r"parents\[0\]"):
        lo.gdn_tree_verify(*args, **dict(kw, parents=torch.tensor([[0, 0]], device=DEVICE)))
    with pytest.raises(ValueError, match="slots"):
        lo.gdn_tree_verify(*args, **dict(kw, state_indices=torch.tensor([99], device=DEVICE)))
    with pytest.raises(TypeError, match="pending"):
        lo.gdn_tree_verify(*args, pending="yes", **kw)
    _, factors = lo.gdn_tree_verify(*args, **kw)
    with pytest.raises(ValueError, match="accepted"):
        lo.gdn_tree_commit(factors, torch.tensor([5], device=DEVICE), **kw)
