"""The p-bit fixed-point number system: correctly rounded arithmetic (against exact Fractions), ties to even,
saturation, closure, array quantisation, and the reference GDN / attention cores running on it."""

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lumotree.reference import gdn
from lumotree.reference.attention import tree_attention_core
from lumotree.reference.fixedpoint import Fixed, FixedFormat, fixed_exp, round_half_even, to_fixed
from lumotree.reference.tree import TokenTree

formats = st.builds(lambda p, f: FixedFormat(p, min(f, p + 4)), st.integers(2, 24), st.integers(0, 20))


def nearest(x: Fraction, fmt: FixedFormat) -> Fraction:
    """Oracle: scan the two grid neighbours of x, pick the nearer (ties: even integer), then clamp."""
    scaled = x * (1 << fmt.frac_bits)
    lo = math.floor(scaled)
    hi = lo + 1
    d_lo, d_hi = scaled - lo, hi - scaled
    n = lo if d_lo < d_hi or (d_lo == d_hi and lo % 2 == 0) else hi
    n = min(max(n, fmt.min_int), fmt.max_int)
    return Fraction(n, 1 << fmt.frac_bits)


@settings(max_examples=200)
@given(fmt=formats, data=st.data())
def test_every_operation_is_the_exact_result_rounded_once(fmt, data):
    ints = st.integers(fmt.min_int, fmt.max_int)
    a, b = Fixed(data.draw(ints), fmt), Fixed(data.draw(ints), fmt)
    for result, exact in ((a + b, a.value + b.value), (a - b, a.value - b.value), (a * b, a.value * b.value),
                          (-a, -a.value), (abs(a), abs(a.value))):
        assert isinstance(result, Fixed) and result.fmt == fmt  # closure
        assert fmt.min_int <= result.n <= fmt.max_int
        assert result.value == nearest(exact, fmt)
    if b.n:
        assert (a / b).value == nearest(a.value / b.value, fmt)
    k = data.draw(st.integers(-50, 50))
    assert (a * k).value == nearest(a.value * k, fmt) and (k * a).value == (a * k).value
    assert (k - a).value == nearest(k - a.value, fmt)
    third = Fraction(1, 3)
    assert (a + third).value == nearest(a.value + third, fmt)


def test_rounding_ties_to_even_and_saturation():
    fmt = FixedFormat(8, 2)  # quarters in [-32, 31.75]
    assert fmt(Fraction(1, 8)).value == 0 and fmt(Fraction(3, 8)).value == Fraction(1, 2)  # ties to even
    assert fmt(Fraction(5, 8)).value == Fraction(1, 2) and fmt(Fraction(7, 8)).value == 1
    assert fmt(1000).value == Fraction(127, 4) and fmt(-1000).value == -32
    assert (fmt(30) + fmt(30)).value == Fraction(127, 4)  # saturates, never wraps
    assert (-fmt(-32)).value == Fraction(127, 4)  # the one value whose negation is out of range
    assert fmt(0.1).value == Fraction(0)  # floats are taken exactly, then rounded
    assert [round_half_even(n, 2) for n in (-3, -1, 1, 3, 5)] == [-2, 0, 0, 2, 2]
    assert len(FixedFormat(6, 3).grid()) == 64 and FixedFormat(6, 3).grid()[0].value == -4


def test_mixing_systems_is_refused_and_errors_name_the_problem():
    a = FixedFormat(16, 8)(1)
    with pytest.raises(TypeError, match="float 0.5 in a fx16.8 computation"):
        a * 0.5
    with pytest.raises(TypeError, match="mixing fixed-point formats fx16.8 and fx12.4"):
        a + FixedFormat(12, 4)(1)
    with pytest.raises(ZeroDivisionError):
        a / FixedFormat(16, 8)(0)
    with pytest.raises(ValueError, match="frac_bits = -1"):
        FixedFormat(8, -1)
    with pytest.raises(ValueError, match="'fx<bits>.<frac_bits>'"):
        FixedFormat.parse("q8.4")
    assert FixedFormat.parse("fx12.5") == FixedFormat(12, 5) and FixedFormat(12, 5).name == "fx12.5"
    with pytest.raises(ValueError, match="cannot represent nan"):
        FixedFormat(8, 2)(float("nan"))


@settings(max_examples=60)
@given(fmt=st.builds(FixedFormat, st.integers(2, 40), st.integers(0, 30)),
       values=st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=20))
def test_quantize_array_is_the_scalar_rounding(fmt, values):
    grid = fmt.quantize_array(np.array(values))
    assert grid.dtype == np.float64
    assert [Fraction(g) for g in grid] == [fmt(v).value for v in values]


def test_exp_is_correctly_rounded():
    fmt = FixedFormat(24, 12)
    for n in range(-40000, 20000, 997):
        x = Fixed(n, fmt)
        y = fixed_exp(x)
        exact = math.exp(float(x))
        assert abs(float(y) - exact) <= float(fmt.ulp) / 2 * (1 + 1e-9) or y.n == fmt.max_int
    assert fixed_exp(fmt(-20)).n == 0 and fixed_exp(fmt(100)).n == fmt.max_int


def test_gdn_and_attention_cores_run_in_fixed_point():
    rng = np.random.default_rng(0)
    N, H, K, V = 6, 1, 3, 2
    arrays = dict(q=rng.normal(size=(N, H, K)), k=rng.normal(size=(N, H, K)) / 2, v=rng.normal(size=(N, H, V)),
                  alpha=rng.uniform(0.5, 1, size=(N, H)), beta=rng.uniform(0, 2, size=(N, H)), S0=np.zeros((H, K, V)))
    wide = FixedFormat(64, 44)
    o_fixed, S_fixed = gdn.chain(*(to_fixed(a, wide) for a in arrays.values()), scale=wide(Fraction(1, 2)))
    o_float, _ = gdn.chain(*(to_fixed(a, wide).astype(float) for a in arrays.values()), scale=0.5)
    assert all(isinstance(x, Fixed) for x in o_fixed.ravel())
    assert np.abs(o_fixed.astype(float) - o_float).max() < 1e-9  # 44 fractional bits: rounding errors ~1e-13
    narrow = FixedFormat(10, 4)
    o_narrow, _ = gdn.chain(*(to_fixed(a, narrow) for a in arrays.values()), scale=narrow(Fraction(1, 2)))
    assert all(x.fmt == narrow and Fraction(x.value * 16).denominator == 1 for x in o_narrow.ravel())
    keys = to_fixed(rng.normal(size=(4, 1, 2)), narrow)
    empty = np.zeros((0, 1, 2), dtype=object)
    o = tree_attention_core(keys, empty, empty, keys, keys, TokenTree.chain(4), narrow(1), exp=fixed_exp)
    assert all(isinstance(x, Fixed) and x.fmt == narrow for x in o.ravel())
