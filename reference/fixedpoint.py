r"""A p-bit fixed-point number system for the exact reference: constant precision, run rather than assumed.

A format ``Q(p, f)`` (:class:`FixedFormat`) holds the numbers ``n * 2^-f`` with ``n`` a p-bit two's-complement
integer, ``-2^(p-1) <= n <= 2^(p-1) - 1``. Every operation computes its exact result and rounds it **once** to the
format: to the nearest representable value, ties to even (the hardware default), then saturates at the largest or
smallest value (no wrap-around). So each operation is *correctly rounded*; sums and products of many terms are
rounded after every step, in the order the code performs them (as a fixed-point datapath would).

Two ways to use it:

- :class:`Fixed` is a number: ``+ - * /``, negation, ``abs``, comparisons, ``float()``. It mixes with Python ``int``
  and ``fractions.Fraction`` (converted exactly, then rounded) and refuses floats (a float inside a fixed-point
  computation is a silent second number system). Object arrays of :class:`Fixed` run through the reference cores
  that accept exact inputs (:func:`lumotree.reference.gdn.chain`, :func:`~lumotree.reference.gdn.tree_recurrent`,
  :func:`~lumotree.reference.attention.tree_attention_core` with ``exp=`` :func:`fixed_exp`): the whole recurrence in
  p-bit arithmetic. :func:`to_fixed` converts arrays.
- :meth:`FixedFormat.quantize_array` rounds a float64 array onto the format's grid (same rounding and saturation) and
  returns float64: the model of a cache *stored* at p bits (states rounded after every token) while the arithmetic
  within a token stays float64.

The format is named ``"fx<p>.<f>"`` (e.g. ``"fx16.8"``: 16 bits, 8 of them fractional, range ``[-128, 128)``,
resolution ``2^-8``); :meth:`FixedFormat.parse` reads the name.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from numbers import Integral, Rational, Real
from typing import Any

import numpy as np

__all__ = ["FixedFormat", "Fixed", "to_fixed", "fixed_exp", "round_half_even"]


def round_half_even(numerator: int, denominator: int) -> int:
    """The integer nearest to ``numerator / denominator`` (``denominator != 0``), ties to the even integer."""
    if denominator == 0:
        raise ZeroDivisionError("round_half_even: denominator is 0")
    if denominator < 0:
        numerator, denominator = -numerator, -denominator
    quotient, remainder = divmod(numerator, denominator)  # floor division, 0 <= remainder < denominator
    twice = 2 * remainder
    if twice > denominator or (twice == denominator and quotient % 2 == 1):
        quotient += 1
    return quotient


_NAME = re.compile(r"^fx(\d+)\.(\d+)$")


@dataclass(frozen=True)
class FixedFormat:
    """``Q(bits, frac_bits)``: values ``n * 2^-frac_bits`` with ``n`` a ``bits``-bit two's-complement integer
    (``bits >= 2``, ``0 <= frac_bits``). Rounding: to nearest, ties to even; overflow saturates."""

    bits: int
    frac_bits: int

    def __post_init__(self) -> None:
        for name, value, least in (("bits", self.bits, 2), ("frac_bits", self.frac_bits, 0)):
            if isinstance(value, bool) or not isinstance(value, Integral) or value < least:
                raise ValueError(f"FixedFormat.{name} = {value!r} must be an integer >= {least}")
        object.__setattr__(self, "bits", int(self.bits))
        object.__setattr__(self, "frac_bits", int(self.frac_bits))

    @classmethod
    def parse(cls, name: str) -> FixedFormat:
        """``"fx16.8"`` -> ``FixedFormat(16, 8)``."""
        match = _NAME.match(name) if isinstance(name, str) else None
        if match is None:
            raise ValueError(f"fixed-point format name {name!r} must look like 'fx<bits>.<frac_bits>', e.g. 'fx16.8'")
        return cls(int(match.group(1)), int(match.group(2)))

    @property
    def name(self) -> str:
        return f"fx{self.bits}.{self.frac_bits}"

    @property
    def min_int(self) -> int:
        return -(1 << (self.bits - 1))

    @property
    def max_int(self) -> int:
        return (1 << (self.bits - 1)) - 1

    @property
    def ulp(self) -> Fraction:
        """The resolution ``2^-frac_bits``."""
        return Fraction(1, 1 << self.frac_bits)

    @property
    def max_value(self) -> Fraction:
        return Fraction(self.max_int, 1 << self.frac_bits)

    @property
    def min_value(self) -> Fraction:
        return Fraction(self.min_int, 1 << self.frac_bits)

    def saturate(self, n: int) -> int:
        return self.max_int if n > self.max_int else (self.min_int if n < self.min_int else n)

    def integer_of(self, x: Any) -> int:
        """The stored integer ``n`` of the value nearest to ``x`` (int, Fraction, float or Fixed; floats are taken
        exactly): ``saturate(round_half_even(x * 2^f))``. NaN and infinities raise ``ValueError``."""
        if isinstance(x, Fixed):
            value = x.value
        elif isinstance(x, (float, np.floating)):
            if not math.isfinite(x):
                raise ValueError(f"cannot represent {x} in {self.name}")
            value = Fraction(float(x))
        elif isinstance(x, (Integral, Rational)):
            value = Fraction(x)
        else:
            raise TypeError(f"cannot convert {type(x).__name__} {x!r} to {self.name}")
        scaled = value * (1 << self.frac_bits)
        return self.saturate(round_half_even(scaled.numerator, scaled.denominator))

    def __call__(self, x: Any) -> Fixed:
        """The representable value nearest to ``x`` as a :class:`Fixed`."""
        return Fixed(self.integer_of(x), self)

    def grid(self) -> list[Fixed]:
        """Every representable value, smallest first (``2^bits`` of them; refuses ``bits > 20``)."""
        if self.bits > 20:
            raise ValueError(f"{self.name} has 2^{self.bits} values; grid() enumerates at most 2^20")
        return [Fixed(n, self) for n in range(self.min_int, self.max_int + 1)]

    def quantize_array(self, x: Any) -> np.ndarray:
        """Round a float array onto the grid (nearest, ties to even, saturating); returns float64 holding grid values
        exactly. Needs ``bits <= 53`` (every grid value is then a float64)."""
        if self.bits > 53:
            raise ValueError(f"{self.name}: quantize_array needs bits <= 53 so that grid values are float64")
        a = np.asarray(x, dtype=np.float64)
        if not np.all(np.isfinite(a)):
            raise ValueError(f"quantize_array: input holds NaN or inf (cannot represent in {self.name})")
        scale = float(1 << self.frac_bits)
        n = np.rint(a * scale)  # exact scaling by a power of two, then round half to even
        n = np.clip(n, self.min_int, self.max_int)
        return n / scale


class Fixed:
    """One value of a :class:`FixedFormat`: ``n * 2^-f``. Immutable; arithmetic rounds once per operation."""

    __slots__ = ("n", "fmt")

    def __init__(self, n: int, fmt: FixedFormat):
        if isinstance(n, bool) or not isinstance(n, Integral):
            raise TypeError(f"Fixed: n = {n!r} must be an integer (use fmt(x) to round a number)")
        if not isinstance(fmt, FixedFormat):
            raise TypeError(f"Fixed: fmt must be a FixedFormat, got {type(fmt).__name__}")
        if not fmt.min_int <= n <= fmt.max_int:
            raise ValueError(f"Fixed: n = {n} is outside the {fmt.bits}-bit range [{fmt.min_int}, {fmt.max_int}]")
        self.n = int(n)
        self.fmt = fmt

    # -------------------------------------------------------------------------------------------- conversions
    @property
    def value(self) -> Fraction:
        """The exact value as a Fraction."""
        return Fraction(self.n, 1 << self.fmt.frac_bits)

    def __float__(self) -> float:
        return self.n / float(1 << self.fmt.frac_bits)

    def __repr__(self) -> str:
        return f"Fixed({self.value}, {self.fmt.name})"

    def __str__(self) -> str:
        return str(float(self))

    def _exact(self, other: Any) -> Fraction | None:
        """``other`` as an exact Fraction for mixed arithmetic; None if not a number; TypeError for floats and for
        another format."""
        if isinstance(other, Fixed):
            if other.fmt != self.fmt:
                raise TypeError(f"mixing fixed-point formats {self.fmt.name} and {other.fmt.name}; "
                                "convert one explicitly")
            return other.value
        if isinstance(other, bool):
            return None
        if isinstance(other, (Integral, Rational)):
            return Fraction(other)
        if isinstance(other, (float, np.floating)):
            raise TypeError(f"float {other!r} in a {self.fmt.name} computation; round it explicitly with the format "
                            "(fmt(x)) or use an int / Fraction")
        return None

    def _rounded(self, exact: Fraction) -> Fixed:
        scaled = exact * (1 << self.fmt.frac_bits)
        return Fixed(self.fmt.saturate(round_half_even(scaled.numerator, scaled.denominator)), self.fmt)

    # -------------------------------------------------------------------------------------------- arithmetic
    def __add__(self, other: Any) -> Fixed:
        if isinstance(other, Fixed) and other.fmt == self.fmt:
            return Fixed(self.fmt.saturate(self.n + other.n), self.fmt)
        x = self._exact(other)
        return NotImplemented if x is None else self._rounded(self.value + x)

    __radd__ = __add__

    def __sub__(self, other: Any) -> Fixed:
        if isinstance(other, Fixed) and other.fmt == self.fmt:
            return Fixed(self.fmt.saturate(self.n - other.n), self.fmt)
        x = self._exact(other)
        return NotImplemented if x is None else self._rounded(self.value - x)

    def __rsub__(self, other: Any) -> Fixed:
        x = self._exact(other)
        return NotImplemented if x is None else self._rounded(x - self.value)

    def __mul__(self, other: Any) -> Fixed:
        if isinstance(other, Fixed) and other.fmt == self.fmt:
            product = self.n * other.n  # exact, with 2f fractional bits
            return Fixed(self.fmt.saturate(round_half_even(product, 1 << self.fmt.frac_bits)), self.fmt)
        x = self._exact(other)
        return NotImplemented if x is None else self._rounded(self.value * x)

    __rmul__ = __mul__

    def __truediv__(self, other: Any) -> Fixed:
        x = self._exact(other)
        if x is None:
            return NotImplemented
        if x == 0:
            raise ZeroDivisionError(f"division of {self!r} by zero")
        return self._rounded(self.value / x)

    def __rtruediv__(self, other: Any) -> Fixed:
        x = self._exact(other)
        if x is None:
            return NotImplemented
        if self.n == 0:
            raise ZeroDivisionError(f"division of {other!r} by {self!r}")
        return self._rounded(x / self.value)

    def __neg__(self) -> Fixed:
        return Fixed(self.fmt.saturate(-self.n), self.fmt)  # -min_int saturates to max_int

    def __pos__(self) -> Fixed:
        return self

    def __abs__(self) -> Fixed:
        return -self if self.n < 0 else self

    # -------------------------------------------------------------------------------------------- comparisons
    def _compare(self, other: Any) -> Fraction | None:
        if isinstance(other, (float, np.floating)):
            return Fraction(float(other)) if math.isfinite(other) else None
        return self._exact(other)

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, Fixed):
            return other.fmt == self.fmt and other.n == self.n
        x = self._compare(other) if not isinstance(other, bool) else None
        return NotImplemented if x is None else self.value == x

    def __hash__(self) -> int:
        return hash(self.value)

    def __lt__(self, other: Any) -> bool:
        x = self._compare(other)
        return NotImplemented if x is None else self.value < x

    def __le__(self, other: Any) -> bool:
        x = self._compare(other)
        return NotImplemented if x is None else self.value <= x

    def __gt__(self, other: Any) -> bool:
        x = self._compare(other)
        return NotImplemented if x is None else self.value > x

    def __ge__(self, other: Any) -> bool:
        x = self._compare(other)
        return NotImplemented if x is None else self.value >= x

    def __bool__(self) -> bool:
        return self.n != 0


# a Fixed is a real number: the reference's range checks (numerics.check_range) compare it like one
Real.register(Fixed)


def to_fixed(x: Any, fmt: FixedFormat) -> np.ndarray:
    """An object array of :class:`Fixed` (each element rounded to ``fmt``) from any array of numbers."""
    a = np.asarray(x)
    out = np.empty(a.shape, dtype=object)
    for idx, value in np.ndenumerate(a):
        out[idx] = fmt(value.item() if isinstance(value, np.generic) else value)
    return out


def fixed_exp(x: Fixed) -> Fixed:
    """``exp(x)`` rounded to ``x``'s format (nearest, ties to even, saturating), from a 64-guard-bit value
    (mpmath); results below half an ulp round to 0."""
    import mpmath

    if not isinstance(x, Fixed):
        raise TypeError(f"fixed_exp takes a Fixed, got {type(x).__name__}")
    fmt = x.fmt
    with mpmath.workprec(fmt.bits + fmt.frac_bits + 64):
        y = mpmath.exp(mpmath.mpf(x.n) / (1 << fmt.frac_bits))
        if y > mpmath.mpf(fmt.max_int + 1) / (1 << fmt.frac_bits) + 1:
            return Fixed(fmt.max_int, fmt)
        mantissa, exponent = y.man_exp
    exact = Fraction(int(mantissa)) * (Fraction(2) ** int(exponent))
    return fmt(exact)
