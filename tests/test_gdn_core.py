"""The GDN core: closed form + commit equal the tree recurrence exactly; chain = tree on a path; any number system."""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import build_tree_parents, random_gdn_inputs, trees

from lumotree.reference import TokenTree, gdn


@settings(max_examples=25)
@given(parents=trees(max_nodes=24), group=st.sampled_from([1, 2]), seed=st.integers(0, 2**31))
def test_closed_form_and_commit_exact_on_fractions(parents, group, seed):
    rng = np.random.default_rng(seed)
    tree = TokenTree(parents)
    H, K, V = 1, 2, 2
    inputs = random_gdn_inputs(rng, tree.num_nodes, H, H * group, K, V, exact=True)
    scale = Fraction(1, 2)
    o_rec, states = gdn.tree_recurrent(*inputs, tree, scale=scale)
    o_cf, factors = gdn.tree_closed_form(*inputs, tree, scale=scale)
    assert (o_rec == o_cf).all()
    assert all(isinstance(x, Fraction) for x in o_cf.flat)
    node = int(rng.integers(0, tree.num_nodes))
    assert (gdn.commit(inputs[-1], factors, tree, node) == states[node]).all()
    assert (gdn.commit(inputs[-1], factors, tree, 0) == states[0]).all()


@settings(max_examples=30)
@given(parents=trees(max_nodes=24), group=st.sampled_from([1, 2]), seed=st.integers(0, 2**31))
def test_closed_form_float64(parents, group, seed):
    rng = np.random.default_rng(seed)
    tree = TokenTree(parents)
    H, K, V = 2, 4, 3
    inputs = random_gdn_inputs(rng, tree.num_nodes, H, H * group, K, V, exact=False)
    o_rec, states = gdn.tree_recurrent(*inputs, tree)
    o_cf, factors = gdn.tree_closed_form(*inputs, tree)
    rel = np.linalg.norm(o_rec - o_cf) / np.linalg.norm(o_rec)
    assert rel < 1e-12
    for node in range(tree.num_nodes):
        S = gdn.commit(inputs[-1], factors, tree, node)
        assert np.linalg.norm(S - states[node]) / np.linalg.norm(states[node]) < 1e-12


@given(n=st.integers(1, 10), seed=st.integers(0, 2**31))
def test_chain_equals_tree_on_a_path(n, seed):
    rng = np.random.default_rng(seed)
    tree = TokenTree.chain(n)
    inputs = random_gdn_inputs(rng, n, 1, 2, 2, 2, exact=True)
    o_chain, S_last = gdn.chain(*inputs, scale=1)
    o_tree, states = gdn.tree_recurrent(*inputs, tree, scale=1)
    assert (o_chain == o_tree).all() and (S_last == states[-1]).all()


def test_path_decay_matches_gamma_ratio():
    tree = TokenTree([-1, 0, 1, 1, 3])
    alpha = np.array([Fraction(1, 2), Fraction(2, 3), Fraction(3, 4), Fraction(4, 5), Fraction(5, 6)], dtype=object)
    gamma, D = gdn.path_decay(alpha, tree)
    for i in range(5):
        for j in range(5):
            expected = gamma[i] / gamma[j] if tree.is_ancestor(j, i) else 0
            assert D[i, j] == expected


def test_runs_on_sympy_symbols():
    sympy = pytest.importorskip("sympy")
    tree = TokenTree([-1, 0, 0])
    N, H, HV, K, V = 3, 1, 1, 1, 1

    def sym(name, shape):
        return np.array(sympy.symbols(f"{name}0:{int(np.prod(shape))}"), dtype=object).reshape(shape)

    q, k, v, S0 = sym("q", (N, H, K)), sym("k", (N, H, K)), sym("v", (N, HV, V)), sym("s", (HV, K, V))
    alpha, beta = sym("a", (N, HV)), sym("b", (N, HV))
    o_rec, states = gdn.tree_recurrent(q, k, v, alpha, beta, S0, tree, scale=1)
    o_cf, factors = gdn.tree_closed_form(q, k, v, alpha, beta, S0, tree, scale=1)
    for x, y in zip(o_rec.flat, o_cf.flat):
        assert sympy.expand(x - y) == 0
    S2 = gdn.commit(S0, factors, tree, 2)
    assert sympy.cancel(S2[0, 0, 0] - states[2, 0, 0, 0]) == 0


def test_runs_on_z3_terms():
    z3 = pytest.importorskip("z3")
    tree = TokenTree([-1, 0])
    N = 2

    def var(name, shape):
        return np.array([z3.Real(f"{name}{i}") for i in range(int(np.prod(shape)))], dtype=object).reshape(shape)

    q, k, v, S0 = var("q", (N, 1, 1)), var("k", (N, 1, 1)), var("v", (N, 1, 1)), var("s", (1, 1, 1))
    alpha, beta = var("a", (N, 1)), var("b", (N, 1))
    o_rec, _ = gdn.tree_recurrent(q, k, v, alpha, beta, S0, tree, scale=1)
    o_cf, _ = gdn.tree_closed_form(q, k, v, alpha, beta, S0, tree, scale=1)
    solver = z3.Solver()
    solver.add(z3.Or(*[x != y for x, y in zip(o_rec.flat, o_cf.flat)]))
    assert solver.check() == z3.unsat


def _good(n=3):
    rng = np.random.default_rng(0)
    return list(random_gdn_inputs(rng, n, 2, 4, 2, 2, exact=False))  # H=2, HV=4


@pytest.mark.parametrize(
    "index, bad, match",
    [
        (0, np.zeros((3, 2, 3)), r"k has shape"),
        (2, np.zeros((3, 3, 2)), r"HV = 3 value heads"),
        (3, np.zeros((3, 1)), r"alpha has shape"),
        (4, np.full((3, 4), 2.5), r"beta\[0, 0\] = 2.5 is outside \[0, 2\]"),
        (4, np.full((3, 4), -0.1), r"beta\[0, 0\]"),
        (3, np.full((3, 4), 1.5), r"alpha\[0, 0\]"),
        (5, np.zeros((4, 2, 3)), r"S0 has shape"),
    ],
)
def test_bad_inputs_name_the_argument(index, bad, match):
    inputs = _good()
    if index == 0:  # change k, not q
        inputs[1] = bad
    else:
        inputs[index] = bad
    with pytest.raises(ValueError, match=match):
        gdn.tree_closed_form(*inputs, TokenTree([-1, 0, 1]))


@pytest.mark.parametrize("name, index", [("q", 0), ("v", 2), ("alpha", 3), ("S0", 5)])
def test_nan_and_inf_rejected(name, index):
    for value in (np.nan, np.inf):
        inputs = _good()
        inputs[index] = inputs[index].copy()
        inputs[index].flat[1] = value
        with pytest.raises(ValueError, match=rf"{name}"):
            gdn.tree_recurrent(*inputs, TokenTree([-1, 0, 1]))


def test_mixed_number_systems_rejected():
    inputs = list(random_gdn_inputs(np.random.default_rng(1), 2, 1, 1, 2, 2, exact=True))
    inputs[2] = np.ones((2, 1, 2))
    with pytest.raises(TypeError, match=r"^v is a float64 array"):
        gdn.chain(*inputs, scale=1)


def test_tree_size_mismatch():
    with pytest.raises(ValueError, match="tree has 4 nodes"):
        gdn.tree_recurrent(*_good(3), TokenTree.chain(4))


def test_exact_default_scale():
    inputs = random_gdn_inputs(np.random.default_rng(2), 2, 1, 1, 4, 2, exact=True)
    o, _ = gdn.chain(*inputs)  # K = 4: scale 1/2 is exact
    assert all(isinstance(x, Fraction) for x in o.flat)
    inputs = random_gdn_inputs(np.random.default_rng(2), 2, 1, 1, 2, 2, exact=True)
    with pytest.raises(ValueError, match="irrational"):
        gdn.chain(*inputs)


# ---------------------------------------------------------------------------------------------------- zero decay
@pytest.mark.parametrize("exact, decay", [(False, "zero"), (False, "underflow"), (True, "zero")])
def test_commit_and_closed_form_at_zero_or_underflowing_decay(exact, decay):
    """alpha = 0 (accepted by the input checks, handled by the recurrence) and alpha = 1e-200 on a short path (whose
    path product underflows in float64): the commit multiplies alphas along the path and never divides Gamma_a by
    Gamma_j, which would be 0 / 0 (NaN in float64, ZeroDivisionError with Fractions)."""
    tree = TokenTree([-1, 0, 1, 1, 3])
    inputs = list(random_gdn_inputs(np.random.default_rng(3), 5, 1, 2, 2, 2, exact=exact))
    small = 0 if decay == "zero" else 1e-200
    alpha = inputs[3].copy()
    alpha[0, 0] = alpha[1, 1] = alpha[3, 0] = alpha[3, 1] = Fraction(small) if exact else small
    inputs[3] = alpha
    scale = Fraction(1, 2) if exact else 0.5
    o_rec, states = gdn.tree_recurrent(*inputs, tree, scale=scale)
    o_cf, factors = gdn.tree_closed_form(*inputs, tree, scale=scale)
    for node in range(tree.num_nodes):
        S = gdn.commit(inputs[-1], factors, tree, node)
        if exact:
            assert (S == states[node]).all()
        else:
            assert np.isfinite(S).all() and np.abs(S - states[node]).max() < 1e-12
    if exact:
        assert (o_cf == o_rec).all()
    else:
        assert np.isfinite(o_cf).all() and np.abs(o_cf - o_rec).max() < 1e-12


@pytest.mark.parametrize(
    "shapes, match",
    [
        ({"q": (3, 0, 2), "k": (3, 0, 2)}, r"^q has shape \(3, 0, 2\): H \(q/k heads\) and K"),
        ({"q": (3, 2, 0), "k": (3, 2, 0), "S0": (4, 0, 2)}, r"^q has shape \(3, 2, 0\): H \(q/k heads\) and K"),
        ({"v": (3, 0, 2), "alpha": (3, 0), "beta": (3, 0), "S0": (0, 2, 2)}, r"^v has shape \(3, 0, 2\): HV"),
        ({"v": (3, 4, 0), "S0": (4, 2, 0)}, r"^v has shape \(3, 4, 0\): HV \(value heads\) and V"),
    ],
)
def test_empty_head_or_key_dimensions_name_the_argument(shapes, match):
    inputs = dict(zip(("q", "k", "v", "alpha", "beta", "S0"), _good()))
    inputs.update({name: np.zeros(shape) for name, shape in shapes.items()})
    tree = TokenTree.chain(3)
    for run in (lambda: gdn.chain(*inputs.values()), lambda: gdn.tree_closed_form(*inputs.values(), tree)):
        with pytest.raises(ValueError, match=match):
            run()


def test_a_parent_list_in_place_of_a_tree_is_a_type_error():
    for fn in (gdn.tree_recurrent, gdn.tree_closed_form):
        with pytest.raises(TypeError, match=r"^tree must be a TokenTree .*got list$"):
            fn(*_good(), [-1, 0, 1])
    _, factors = gdn.tree_closed_form(*_good(), TokenTree([-1, 0, 1]))
    with pytest.raises(TypeError, match=r"^tree must be a TokenTree"):
        gdn.commit(_good()[-1], factors, [-1, 0, 1], 2)
    with pytest.raises(TypeError, match=r"^factors must be the GDNFactors"):
        gdn.commit(_good()[-1], tuple(factors)[:3], TokenTree([-1, 0, 1]), 2)
    with pytest.raises(TypeError, match=r"^tree must be a TokenTree"):
        gdn.conv_window_index([-1, 0], 4)


@pytest.mark.parametrize("scale, error, match", [(float("nan"), ValueError, r"^scale = nan is not finite$"),
                                                 (float("inf"), ValueError, r"^scale = inf is not finite$"),
                                                 (True, TypeError, r"^scale = True must be a real scalar$"),
                                                 (np.ones(2), TypeError, r"^scale = .* must be a real scalar")])
def test_a_bad_scale_names_the_argument(scale, error, match):
    for fn in (lambda: gdn.chain(*_good(), scale=scale), lambda: gdn.tree_closed_form(*_good(), TokenTree.chain(3),
                                                                                         scale=scale)):
        with pytest.raises(error, match=match):
            fn()


@pytest.mark.parametrize("solve", ["substitution", "doubling", "halves"])
def test_every_solve_schedule_gives_the_same_closed_form(solve):
    """The kernels' doubling product and inverse by halves solve the same triangular system as forward substitution:
    exactly on Fractions (a deep tree: the doubling's every level), to rounding in float64."""
    tree = TokenTree(build_tree_parents("deep_wide", 20, np.random.default_rng(4)))
    exact = random_gdn_inputs(np.random.default_rng(5), 20, 1, 2, 2, 2, exact=True)
    o_rec, _ = gdn.tree_recurrent(*exact, tree, scale=Fraction(1, 2))
    o_cf, factors = gdn.tree_closed_form(*exact, tree, scale=Fraction(1, 2), solve=solve)
    assert (o_cf == o_rec).all()
    floats = random_gdn_inputs(np.random.default_rng(6), 20, 2, 4, 3, 2, exact=False)
    o_sub, _ = gdn.tree_closed_form(*floats, tree, solve="substitution")
    o_sched, _ = gdn.tree_closed_form(*floats, tree, solve=solve)
    assert np.abs(o_sched - o_sub).max() < 1e-10
    with pytest.raises(ValueError, match=r"^solve = 'lu' is not one of"):
        gdn.tree_closed_form(*floats, tree, solve="lu")
