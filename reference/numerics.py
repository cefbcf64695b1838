"""Number-system plumbing shared by the exact reference.

The reference core is written once with numpy and runs on float64 arrays or on object arrays whose elements are
``fractions.Fraction``, sympy expressions or z3 real terms. These helpers keep that promise in one place: input
coercion (one number system per call, never a silent float in an exact computation) and validation with errors that
name the argument.

Writing rule for code that must run on z3 terms: put the array on the left of every product (``arr * x``, never
``x * arr``): a z3 scalar on the left tries to convert the whole array to a number instead of deferring to numpy.
"""

from __future__ import annotations

from fractions import Fraction
from math import isfinite, isqrt
from numbers import Real
from typing import Any

import numpy as np

__all__ = [
    "coerce_inputs",
    "is_exact",
    "check_shape",
    "check_finite",
    "check_range",
    "check_scale",
    "default_scale",
    "validate_weight_fields",
]


def is_exact(x: np.ndarray) -> bool:
    """True for object arrays (Fraction / sympy / z3 elements)."""
    return x.dtype == object


def coerce_inputs(**arrays: Any) -> dict[str, np.ndarray]:
    """Bring every named input into one number system.

    All inputs float (or int) -> float64 arrays. Any input an object array -> every input an object array; a float
    array next to an exact one raises ``TypeError`` naming it (a float inside an exact computation silently loses
    exactness). Integer arrays join either system exactly. Bool and complex inputs are rejected.
    """
    out = {name: np.asarray(a) for name, a in arrays.items()}
    exact = any(a.dtype == object for a in out.values())
    for name, a in out.items():
        kind = a.dtype.kind
        if kind in "bcSUV" or (kind == "M" or kind == "m"):
            raise TypeError(f"{name} has dtype {a.dtype}; expected a real float, integer or object (exact) array")
        if exact:
            if kind == "f":
                raise TypeError(
                    f"{name} is a {a.dtype} array but other inputs are exact (object) arrays; pass every input in one "
                    "number system (e.g. convert floats with fractions.Fraction)"
                )
            if kind in "iu":
                out[name] = a.astype(object)
        else:
            out[name] = a.astype(np.float64)
    return out


def check_shape(name: str, a: np.ndarray, expected: tuple[int | None, ...], names: str) -> None:
    """Raise ``ValueError`` unless ``a.shape`` matches ``expected`` (None = any); ``names`` spells the dims."""
    if a.ndim != len(expected) or any(e is not None and s != e for s, e in zip(a.shape, expected)):
        raise ValueError(f"{name} has shape {tuple(a.shape)}, expected [{names}] = {expected}")


def check_finite(name: str, a: np.ndarray) -> None:
    """Raise ``ValueError`` if a float array holds NaN or inf (object arrays: float elements are checked)."""
    if a.dtype == object:
        for idx, x in np.ndenumerate(a):
            if isinstance(x, float) and not np.isfinite(x):
                raise ValueError(f"{name}{list(idx)} = {x} is not finite")
        return
    if not np.all(np.isfinite(a)):
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])
        raise ValueError(f"{name} contains NaN or inf (first at index {list(bad)}: {a[bad]})")


def check_range(name: str, a: np.ndarray, low: Any, high: Any, *, low_open: bool = False) -> None:
    """Raise ``ValueError`` unless every comparable element lies in [low, high] (or (low, high]).

    Symbolic elements (sympy symbols, z3 terms) cannot be compared and are skipped: their range is an assumption of
    the proof that uses them.
    """
    for idx, x in np.ndenumerate(a):
        if isinstance(x, (Real, np.floating, np.integer)):
            ok = (x > low if low_open else x >= low) and x <= high
            if not ok:
                lb = "(" if low_open else "["
                raise ValueError(f"{name}{list(idx)} = {x} is outside {lb}{low}, {high}]")


def check_scale(scale: Any, exact: bool, name: str = "scale") -> None:
    """Raise unless ``scale`` is a usable real: ``TypeError`` for a bool, a complex number, an array, or a float with
    exact inputs (it would silently lose exactness); ``ValueError`` for a NaN or infinite float."""
    if isinstance(scale, (bool, np.bool_, complex, np.complexfloating, np.ndarray, str, bytes)):
        raise TypeError(f"{name} = {scale!r} must be a real scalar")
    if isinstance(scale, (float, np.floating)):
        if exact:
            raise TypeError(f"{name} is a float but the inputs are exact; pass a Fraction or an exact expression")
        if not isfinite(scale):
            raise ValueError(f"{name} = {scale} is not finite")


def default_scale(head_dim: int, exact: bool) -> Any:
    """``head_dim ** -0.5``: a float, or an exact Fraction when ``head_dim`` is a perfect square."""
    if not exact:
        return float(head_dim) ** -0.5
    root = isqrt(head_dim)
    if root * root == head_dim:
        return Fraction(1, root)
    raise ValueError(
        f"scale=None needs sqrt(K) = sqrt({head_dim}), which is irrational: pass scale explicitly for exact inputs"
    )


def validate_weight_fields(weights: Any, shapes: dict[str, tuple[int, ...]], prefix: str) -> None:
    """Cast each named field of a weights dataclass to float64 in place and raise ``ValueError`` naming
    ``prefix.field`` on a wrong shape or a non-finite entry."""
    for name, shape in shapes.items():
        value = np.asarray(getattr(weights, name), dtype=np.float64)
        setattr(weights, name, value)
        check_shape(f"{prefix}.{name}", value, shape, ", ".join(str(s) for s in shape))
        check_finite(f"{prefix}.{name}", value)
