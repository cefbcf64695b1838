"""Number systems the checks run the reference on, and the shapes they range over.

- sympy: the sparse polynomial ring ``QQ[x_1, ..., x_n]`` (canonical form: a polynomial identity holds iff the
  difference is the zero polynomial) and its fraction field ``QQ(x_1, ..., x_n)`` where the code divides.
- Z3: real terms; an identity is proved when its negation is unsat (under stated premises only).
- ``fractions.Fraction``: exact samples, for counterexamples and for random "checked" scopes.

Tree shapes: every parent array of N nodes in topological order (``parents[i]`` in ``[0, i)``), ``(N - 1)!`` of them.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

__all__ = [
    "Dims",
    "InputSpec",
    "all_parent_arrays",
    "count_parent_arrays",
    "random_parent_array",
    "polynomial_ring",
    "symbolic_arrays",
    "z3_arrays",
    "random_fraction_arrays",
    "first_difference",
    "lookup",
    "random_fraction",
    "z3_value",
    "z3_solver",
    "Z3_RLIMIT",
    "show",
]

#: Z3's resource limit per query (``rlimit``: a count of solver steps, the same on every machine and under any load,
#: so a verdict never depends on wall-clock time). The hardest query of the full scope uses about 6e5.
Z3_RLIMIT = 50_000_000


def all_parent_arrays(num_nodes: int) -> Iterator[tuple[int, ...]]:
    """Every valid parent array of ``num_nodes`` nodes: ``(-1, p_1, ..., p_{N-1})`` with ``0 <= p_i < i``."""
    for rest in itertools.product(*(range(i) for i in range(1, num_nodes))):
        yield (-1, *rest)


def count_parent_arrays(max_nodes: int, min_nodes: int = 1) -> int:
    """Number of parent arrays with ``min_nodes..max_nodes`` nodes: ``sum (N - 1)!``."""
    return sum(math.factorial(n - 1) for n in range(min_nodes, max_nodes + 1))


def random_parent_array(num_nodes: int, rng: random.Random) -> tuple[int, ...]:
    """A random tree shape: chain, star, or uniform random parents (each with probability 1/3 for N > 2)."""
    kind = rng.choice(("chain", "star", "random"))
    if kind == "chain":
        return (-1, *range(num_nodes - 1))
    if kind == "star":
        return (-1, *([0] * (num_nodes - 1)))
    return (-1, *(rng.randrange(i) for i in range(1, num_nodes)))


@dataclass(frozen=True)
class Dims:
    """GDN dimensions: ``H`` q/k heads, ``HV`` value heads, key dim ``K``, value dim ``V``."""

    H: int
    HV: int
    K: int
    V: int

    def __str__(self) -> str:
        return f"H={self.H} HV={self.HV} K={self.K} V={self.V}"


@dataclass(frozen=True)
class InputSpec:
    """Named input arrays with their shapes and value ranges (``gate``: alpha in (0, 1], ``strength``: beta in
    [0, 2], ``free``: any real)."""

    shapes: dict[str, tuple[int, ...]]
    kinds: dict[str, str]

    @classmethod
    def gdn(cls, num_nodes: int, dims: Dims) -> InputSpec:
        N, H, HV, K, V = num_nodes, dims.H, dims.HV, dims.K, dims.V
        shapes = {
            "q": (N, H, K),
            "k": (N, H, K),
            "v": (N, HV, V),
            "alpha": (N, HV),
            "beta": (N, HV),
            "S0": (HV, K, V),
            "scale": (),
        }
        kinds = {name: "free" for name in shapes} | {"alpha": "gate", "beta": "strength", "scale": "positive"}
        return cls(shapes, kinds)

    def names(self) -> list[str]:
        """Flat variable names ``q_0_0_1`` etc., in a fixed order."""
        return [_entry_name(name, idx) for name, shape in self.shapes.items() for idx in np.ndindex(*shape)]


def _entry_name(name: str, idx: tuple[int, ...]) -> str:
    return "_".join([name, *map(str, idx)])


def _fill(spec: InputSpec, values: Iterator[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, shape in spec.shapes.items():
        if shape == ():
            out[name] = next(values)
            continue
        arr = np.empty(shape, dtype=object)
        for idx in np.ndindex(*shape):
            arr[idx] = next(values)
        out[name] = arr
    return out


def polynomial_ring(names: list[str], fractions: bool = False) -> tuple[Any, list[Any]]:
    """sympy's sparse ``QQ[names]`` (or the field ``QQ(names)`` with ``fractions=True``) and its generators."""
    from sympy import QQ
    from sympy.polys.fields import field
    from sympy.polys.rings import ring

    domain, *gens = (field if fractions else ring)(names, QQ)
    return domain, gens


def symbolic_arrays(spec: InputSpec, fractions: bool = False) -> tuple[dict[str, Any], Any]:
    """Every input entry an independent generator of ``QQ[...]`` (or ``QQ(...)``); returns (arrays, domain)."""
    domain, gens = polynomial_ring(spec.names(), fractions)
    return _fill(spec, iter(gens)), domain


def z3_arrays(spec: InputSpec, context: Any = None) -> tuple[dict[str, Any], list[Any]]:
    """Every input entry an independent Z3 real (in ``context``, default Z3's global one); returns (arrays, flat
    list of the variables)."""
    import z3

    variables = [z3.Real(n, context) for n in spec.names()]
    return _fill(spec, iter(variables)), variables


def random_fraction(kind: str, rng: random.Random) -> Fraction:
    """A small random rational in the range of its kind."""
    if kind == "gate":
        return Fraction(rng.randint(1, 8), 8)
    if kind == "strength":
        return Fraction(rng.randint(0, 16), 8)
    if kind == "positive":
        return Fraction(rng.randint(1, 4), 4)
    return Fraction(rng.randint(-8, 8), rng.randint(1, 4))


def random_fraction_arrays(spec: InputSpec, rng: random.Random) -> dict[str, Any]:
    """Random exact inputs of ``spec`` (alpha in (0, 1], beta in [0, 2])."""
    values = (random_fraction(spec.kinds[name], rng) for name, shape in spec.shapes.items() for _ in np.ndindex(*shape))
    return _fill(spec, values)


def first_difference(lhs: dict[str, Any], rhs: dict[str, Any], is_zero: Callable[[Any], bool]) -> str | None:
    """The first ``name[idx]`` where ``lhs`` and ``rhs`` differ (``is_zero(a - b)`` false), or None."""
    for name in lhs:
        a, b = np.asarray(lhs[name], dtype=object), np.asarray(rhs[name], dtype=object)
        if a.shape != b.shape:
            return f"{name} (shapes {a.shape} vs {b.shape})"
        for idx in np.ndindex(*a.shape):
            if not is_zero(a[idx] - b[idx]):
                return f"{name}[{', '.join(map(str, idx))}]" if idx else name
    return None


def lookup(arrays: dict[str, Any], entry: str) -> Any:
    """The value of ``name[i, j]`` (as written by :func:`first_difference`) in ``arrays``."""
    name, _, rest = entry.partition("[")
    value = np.asarray(arrays[name], dtype=object)
    if rest:
        value = value[tuple(int(t) for t in rest.rstrip("]").split(","))]
    return value


def z3_value(model: Any, term: Any) -> Fraction | str:
    """A Z3 model's value of ``term``: an exact Fraction when rational, else a decimal approximation."""
    import z3

    value = model.eval(term, model_completion=True)
    if z3.is_rational_value(value):
        return Fraction(value.numerator_as_long(), value.denominator_as_long())
    if z3.is_algebraic_value(value):
        return value.approx(20).as_decimal(20)
    if z3.is_bv_value(value):
        return value.as_long()
    return str(value)


def z3_solver(context: Any = None) -> Any:
    """A one-shot Z3 solver in ``context`` under the deterministic resource limit :data:`Z3_RLIMIT` (no wall-clock
    timeout). One solver per query: push/pop would switch Z3 to its incremental core, which lacks nlsat."""
    import z3

    solver = z3.Solver(ctx=context)
    solver.set("rlimit", Z3_RLIMIT)
    return solver


def show(value: Any) -> Any:
    """JSON-friendly form of an exact value or array (Fractions as strings, arrays as nested lists)."""
    if isinstance(value, np.ndarray):
        return [show(v) for v in value] if value.ndim else show(value[()])
    if isinstance(value, (list, tuple)):
        return [show(v) for v in value]
    if isinstance(value, dict):
        return {k: show(v) for k, v in value.items()}
    if isinstance(value, (int, str)) or value is None:
        return value
    return str(value)
