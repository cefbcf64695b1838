r"""What the launch code computes for a kernel, as functions of the sizes: recorded by running the launch code itself.

:func:`record` runs a launch function (``portable_verify``, ``kv_commit``, ...) on ``meta`` tensors (shapes and
strides, no memory, no data) with every ``@triton.jit`` object of :mod:`lumotree.optimized.ops` replaced by a
recorder, so each ``kernel[grid](*args, **kwargs)`` it makes is captured instead of run: the grid, every argument
(tensors with their shapes, strides and storage), the constexprs and the launch options, exactly as the launch code
computed them. The launch functions' device checks accept ``meta`` tensors while recording (they then act as under
the Triton interpreter); ``validate=False`` skips the checks that read data.

:func:`fit` records a launch at the corners of a box of sizes (two values per symbolic size, never 1: Triton
specialises the integer 1 to a constant) and reads every integer the launch passes (grid, integer arguments,
tensor spans and storage, descriptor shapes and strides) as a multilinear polynomial in the symbolic sizes, checked
at one more point off the corners; everything else (constexprs, dtypes, options) must not change across the box.
The polynomials become Z3 terms over the sizes' symbols.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import itertools
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import z3

from .kernel_ir import is_kernel, kernel_name

__all__ = ["Dim", "LaunchConfig", "Recorded", "FittedLaunch", "Poly", "record", "fit", "tensor_numbers"]


@dataclass(frozen=True)
class Dim:
    """A symbolic size: ``name``, the values to fit at (two corners and a check point, none of them 1), and the
    admitted range ``[low, high]`` (``high`` None: bounded only by the premises on memory and the grid)."""

    name: str
    samples: tuple[int, int, int]
    low: int
    high: int | None = None


@dataclass(frozen=True)
class LaunchConfig:
    """One way a launch function is called: ``what`` it covers, its symbolic sizes ``dims``, the ``fixed`` ones, and
    ``make(sizes)`` giving the call on ``meta`` tensors (``sizes``: every size by name); ``quick``: in the quick
    scope too; ``distinct_slots``: every launch validates its slots distinct, so there are at most ``P`` requests."""

    what: str
    dims: tuple[Dim, ...]
    fixed: dict[str, int]
    make: Callable[[dict[str, int]], Callable[[], Any]]
    quick: bool = True
    distinct_slots: bool = False


@dataclass
class Recorded:
    """One captured launch ``kernel[grid](*args, **kwargs)``."""

    kernel: Any
    grid: tuple
    args: tuple
    kwargs: dict


class _Recorder:
    def __init__(self, kernel: Any, sink: list[Recorded]):
        self.kernel, self.sink = kernel, sink

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            shown = grid(dict(zip(self.kernel.arg_names, args)) | kwargs) if callable(grid) else grid
            self.sink.append(Recorded(self.kernel, tuple(shown), args, kwargs))

        return launch


@functools.cache
def _ops_modules() -> tuple[Any, ...]:
    """Every module of :mod:`lumotree.optimized.ops` (imported once)."""
    import lumotree.optimized.ops as ops

    names = [info.name for info in pkgutil.walk_packages(ops.__path__, ops.__name__ + ".")]
    modules = []
    for name in names:
        if name.endswith("fused_kernel"):
            continue  # Gluon (sm_90 only); its launch is the fused verify, not recorded here
        with contextlib.suppress(ImportError):
            modules.append(importlib.import_module(name))
    return tuple(modules)


def record(call: Callable[[], Any]) -> tuple[list[Recorded], list[tuple[str, int]]]:
    """The launches ``call()`` makes, in order, with the kernels not run (module docstring), and the limits it
    validates on the way: ``(what, value)`` pairs, each admitting only ``value <= INDEX_MAX``
    (:func:`~lumotree.optimized.ops.checks.check_request_rows`: the offsets within one request fit int32)."""
    from lumotree.optimized.ops import checks

    sink: list[Recorded] = []
    limits: list[tuple[str, int]] = []

    def request_rows(name: str, t: Any) -> None:
        limits.append((name, checks.request_extent(t)))
        validate_rows(name, t)

    validate_rows = checks.check_request_rows
    patched = []
    for module in _ops_modules():
        for name, value in list(vars(module).items()):
            if is_kernel(value):
                patched.append((module, name, value))
                setattr(module, name, _Recorder(value, sink))
            elif value is validate_rows:
                patched.append((module, name, value))
                setattr(module, name, request_rows)
    interpreting = checks.interpreting
    checks.interpreting = lambda: True  # the device checks accept meta tensors while recording
    try:
        call()
    finally:
        checks.interpreting = interpreting
        for module, name, value in reversed(patched):
            setattr(module, name, value)
    return sink, limits


# ---------------------------------------------------------------------------------------------------- polynomials
@dataclass(frozen=True)
class Poly:
    """A multilinear polynomial with integer coefficients: monomial (a frozenset of size names) -> coefficient."""

    terms: tuple[tuple[frozenset, int], ...]

    def at(self, point: dict[str, int]) -> int:
        return sum(c * _product(point[n] for n in mono) for mono, c in self.terms)

    def z3(self, symbols: dict[str, Any], ctx: Any) -> Any:
        total = z3.IntVal(0, ctx)
        for mono, c in self.terms:
            term = z3.IntVal(c, ctx)
            for name in sorted(mono):
                term = term * symbols[name]
            total = total + term
        return z3.simplify(total)

    def range(self, box: dict[str, tuple[int, int]]) -> tuple[int, int]:
        """Its least and largest value over the box (a multilinear polynomial takes both at corners)."""
        names = sorted(box)
        values = [self.at(dict(zip(names, corner))) for corner in itertools.product(*(box[n] for n in names))]
        return min(values), max(values)

    def __str__(self) -> str:
        parts = [f"{c}{'*' if mono else ''}{'*'.join(sorted(mono))}" for mono, c in self.terms]
        return " + ".join(parts) or "0"


def _product(values: Any) -> int:
    out = 1
    for v in values:
        out *= v
    return out


def _fit_poly(dims: list[Dim], corner_values: dict[tuple[int, ...], int]) -> Poly:
    """The multilinear polynomial through the values at the corners (``corner_values[bits]``: bit i picks
    ``samples[1]`` of dim i over ``samples[0]``)."""
    k = len(dims)
    coefficients: dict[frozenset, Fraction] = {}
    for subset in itertools.product((0, 1), repeat=k):
        # Moebius inversion in the basis t_i = (x_i - a_i) / (b_i - a_i)
        d = sum((-1) ** (sum(subset) - sum(inner)) * corner_values[inner]
                for inner in itertools.product(*((0, 1) if s else (0,) for s in subset)))
        if d == 0:
            continue
        # expand d * prod_{i in S} (x_i - a_i) / (b_i - a_i) into monomials of x
        chosen = [i for i in range(k) if subset[i]]
        for picks in itertools.product((0, 1), repeat=len(chosen)):
            mono = frozenset(dims[i].name for i, p in zip(chosen, picks) if p)
            coefficient = Fraction(d)
            for i, p in zip(chosen, picks):
                a, b = dims[i].samples[0], dims[i].samples[1]
                coefficient *= Fraction(1, b - a) if p else Fraction(-a, b - a)
            coefficients[mono] = coefficients.get(mono, Fraction(0)) + coefficient
    terms = []
    for mono, c in sorted(coefficients.items(), key=lambda item: sorted(item[0])):
        if c == 0:
            continue
        if c.denominator != 1:
            raise ValueError(f"a launch value is not an integer polynomial in the sizes (coefficient {c})")
        terms.append((mono, int(c)))
    return Poly(tuple(terms))


# ---------------------------------------------------------------------------------------------------- fitting
def tensor_numbers(t: Any) -> dict[str, int]:
    """The integers a kernel may see of a tensor: its span (elements from its first to one past its last, the view's
    extent), its storage in bytes and its element size."""
    span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) if t.numel() else 0
    return {"span": span, "storage_bytes": t.untyped_storage().nbytes(), "element_bytes": t.element_size()}


def _flatten(value: Any, path: tuple) -> list[tuple[tuple, Any]]:
    """``(path, leaf)`` pairs of a recorded argument: integers are leaves to fit, everything else must be stable."""
    import torch

    if isinstance(value, torch.Tensor):
        numbers = tensor_numbers(value)
        return [(path + (key,), number) for key, number in numbers.items()] + [(path + ("dtype",), str(value.dtype))]
    if type(value).__name__ == "TensorDescriptor":
        out = [(path + ("shape", i), int(s)) for i, s in enumerate(value.shape)]
        out += [(path + ("stride", i), int(s)) for i, s in enumerate(value.strides)]
        out += [(path + ("block",), tuple(value.block_shape))]
        return out + _flatten(value.base, path + ("base",))
    if isinstance(value, (tuple, list)):
        return [leaf for i, v in enumerate(value) for leaf in _flatten(v, path + (i,))]
    return [(path, value)]


@dataclass
class FittedLaunch:
    """One launch over the box of sizes: the kernel (as recorded at the first corner), one recorded launch (for its
    constexprs, dtypes and the signature Triton builds from them), and every integer it passes as a
    :class:`Poly` keyed by its path (``("grid", i)``, ``("arg", name)``, ``("arg", name, "span")``, ...)."""

    kernel: Any
    sample: Recorded
    numbers: dict[tuple, Poly] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return kernel_name(self.kernel)


def _leaves(launch: Recorded) -> list[tuple[tuple, Any]]:
    bound = dict(zip(launch.kernel.arg_names, launch.args)) | dict(launch.kwargs)
    leaves = [(("grid", i), int(g)) for i, g in enumerate(launch.grid)]
    for name, value in bound.items():
        leaves += _flatten(value, ("arg", name))
    return leaves


def fit(make_call: Callable[[dict[str, int]], Callable[[], Any]],
        dims: list[Dim]) -> tuple[list[FittedLaunch], list[tuple[str, Poly]]]:
    """Record the launches of ``make_call(sizes)()`` over the box of ``dims`` and fit them (module docstring);
    also the limits the launch code validates (:func:`record`), each a polynomial admitting values up to
    ``INDEX_MAX``."""
    corners = list(itertools.product((0, 1), repeat=len(dims)))
    runs, limits = {}, {}
    for corner in corners:
        runs[corner], limits[corner] = record(make_call({d.name: d.samples[bit] for d, bit in zip(dims, corner)}))
    check, check_limits = record(make_call({d.name: d.samples[2] for d in dims}))
    first = runs[corners[0]]
    fitted_limits = []
    for index, (what, _) in enumerate(limits[corners[0]]):
        poly = _fit_poly(dims, {c: limits[c][index][1] for c in corners})
        if poly.at({d.name: d.samples[2] for d in dims}) != check_limits[index][1]:
            raise ValueError(f"the validated extent of {what} is not multilinear in {[d.name for d in dims]}")
        fitted_limits.append((what, poly))
    for corner, launches in list(runs.items()) + [("check", check)]:
        if [kernel_name(r.kernel) for r in launches] != [kernel_name(r.kernel) for r in first]:
            raise ValueError(f"the launches change across the sizes: {[kernel_name(r.kernel) for r in first]} "
                             f"against {[kernel_name(r.kernel) for r in launches]} at {corner}")
    fitted = []
    for index, sample in enumerate(first):
        base = _leaves(sample)
        per_corner = {corner: dict(_leaves(runs[corner][index])) for corner in corners}
        at_check = dict(_leaves(check[index]))
        launch = FittedLaunch(sample.kernel, sample)
        for path, value in base:
            if isinstance(value, int) and not isinstance(value, bool):
                poly = _fit_poly(dims, {c: per_corner[c][path] for c in corners})
                expected = poly.at({d.name: d.samples[2] for d in dims})
                if expected != at_check[path]:
                    raise ValueError(f"{kernel_name(sample.kernel)}: {path} is not multilinear in "
                                     f"{[d.name for d in dims]} ({expected} predicted, {at_check[path]} recorded)")
                launch.numbers[path] = poly
            elif any(per_corner[c][path] != value for c in corners) or at_check[path] != value:
                raise ValueError(f"{kernel_name(sample.kernel)}: {path} changes across the sizes")
        fitted.append(launch)
    return fitted, fitted_limits
