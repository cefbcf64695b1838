"""The kernels' own tile code run on exact numbers: stand-ins for ``triton.language`` and Gluon's ``language``.

A ``@triton.jit`` / ``@gluon.jit`` function keeps its Python function (``.fn``). :func:`executable` rebuilds that
function with its module's globals, except that ``tl`` and ``gl`` name the stand-ins of an :class:`ExactTiles`, every
kernel function it calls is rebuilt the same way, and the hardware builtins it calls (barriers, fences, shared-memory
reinterpretation, ``warpgroup_mma``) have their exact meaning. A tile is a :class:`Tile`: a numpy array of exact
numbers in the stand-ins' ring (:class:`Polynomials`: Python ints and sympy polynomials; :class:`PrimeField`: int64
residues). A product is the exact product and a rounding helper (:data:`ROUNDING`) the identity, so the function
returns the exact value of its schedule: the products it forms, in the order and on the operands its code gives.

Shared memory is a :class:`SharedTile`: ``.store`` writes it, ``.permute((1, 0))`` is the transposed view (a store
through it writes the transpose, an MMA operand read through it reads the transpose), ``.load`` reads it; a read of a
buffer never written raises. What the stand-ins do not model (pointers, loads from global memory, layouts,
asynchrony, rounding) raises :class:`NotModelled` when a function reaches it, rather than being guessed.
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any

import numpy as np

__all__ = ["ROUNDING", "ExactTiles", "NotModelled", "Polynomials", "PrimeField", "SharedTile", "Tile", "executable"]

#: kernel helpers that round a value to a narrower format before a product: the identity on exact numbers (the
#: accuracy bound of the kernels, not the schedule, accounts for them)
ROUNDING = {"_tf32_round": "rounds fp32 to the nearest tf32 before a tensor-core product"}
#: Gluon builtins the fused kernel calls through module-level names, with their exact meaning (see ExactTiles)
GLUON_BUILTINS = ("_barrier", "fence_async_shared", "warpgroup_mma", "warpgroup_mma_wait", "_reinterpret")
KERNEL_PACKAGE = "lumotree.optimized.ops"


class NotModelled(Exception):
    """The function reached an operation the exact stand-ins do not model."""


# ---------------------------------------------------------------------------------------------------- rings
class Polynomials:
    """Exact numbers as Python objects (ints, ``Fraction``, sympy ``QQ[...]`` polynomials) in object arrays."""

    dtype = object

    def reduce(self, a: np.ndarray) -> np.ndarray:
        return a

    def zeros(self, shape: Any) -> np.ndarray:
        out = np.empty(tuple(shape), dtype=object)
        out.fill(0)
        return out

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``a @ b`` over the nonzero entries only (tree tiles are mostly zero)."""
        out = self.zeros((a.shape[0], b.shape[1]))
        rows_of_b = [[(j, value) for j, value in enumerate(row) if value != 0] for row in b]
        for i in range(a.shape[0]):
            for k in range(a.shape[1]):
                left = a[i, k]
                if left != 0:
                    for j, right in rows_of_b[k]:
                        out[i, j] = out[i, j] + left * right
        return out


class PrimeField:
    """Residues modulo a prime ``p < 2^26`` in int64 arrays: a product of two ``[n, n]`` tiles with ``n <= 128`` sums
    at most ``128 (p - 1)^2 < 2^63`` before its reduction, so nothing wraps."""

    dtype = np.int64

    def __init__(self, p: int):
        if not 2 < p < 2**26:
            raise ValueError(f"p = {p} must be a prime below 2^26")
        self.p = p

    def reduce(self, a: np.ndarray) -> np.ndarray:
        return np.mod(a, self.p) if a.dtype != bool else a

    def zeros(self, shape: Any) -> np.ndarray:
        return np.zeros(tuple(shape), dtype=np.int64)

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if a.shape[-1] > 128:
            raise NotModelled(f"a product over {a.shape[-1]} > 128 terms could wrap int64")
        return np.mod(np.asarray(a, dtype=np.int64) @ np.asarray(b, dtype=np.int64), self.p)


# ---------------------------------------------------------------------------------------------------- tiles
def _exact(value: Any) -> Any:
    """An operand as an array or exact scalar: a float constant of the kernel code must be an integer."""
    if isinstance(value, Tile):
        return value.a
    if isinstance(value, float):
        if not value.is_integer():
            raise NotModelled(f"the float constant {value} is not exact in the stand-ins' ring")
        return int(value)
    return value


class Tile:
    """A tile of a kernel function: ``a`` (a numpy array, 0-d for a scalar) in ``ring``."""

    __slots__ = ("a", "ring")

    def __init__(self, a: Any, ring: Any):
        self.a = np.asarray(a)
        self.ring = ring

    def _new(self, a: Any) -> Tile:
        a = np.asarray(a)
        return Tile(self.ring.reduce(a) if a.dtype != bool else a, self.ring)

    def _op(name: str, reflected: bool = False):  # builds the operator methods below (not a method)
        op = getattr(np, name)

        def method(self, other):
            left, right = (_exact(other), self.a) if reflected else (self.a, _exact(other))
            return self._new(op(left, right))

        return method

    __add__, __radd__ = _op("add"), _op("add", True)
    __sub__, __rsub__ = _op("subtract"), _op("subtract", True)
    __mul__, __rmul__ = _op("multiply"), _op("multiply", True)
    __and__, __rand__ = _op("bitwise_and"), _op("bitwise_and", True)
    __or__, __ror__ = _op("bitwise_or"), _op("bitwise_or", True)
    __eq__, __ne__ = _op("equal"), _op("not_equal")
    __lt__, __le__, __gt__, __ge__ = _op("less"), _op("less_equal"), _op("greater"), _op("greater_equal")
    __mod__, __floordiv__ = _op("mod"), _op("floor_divide")
    __lshift__, __rshift__ = _op("left_shift"), _op("right_shift")
    del _op
    __hash__ = None  # type: ignore[assignment]

    def __neg__(self) -> Tile:
        return self._new(-self.a)

    def __getitem__(self, index: Any) -> Tile:
        return Tile(self.a[index], self.ring)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.a.shape)

    def __bool__(self) -> bool:
        return bool(self.a)

    def __index__(self) -> int:
        return int(self.a)

    __int__ = __index__

    def to(self, dtype: Any, bitcast: bool = False, **_: Any) -> Tile:
        """A conversion: booleans become 0 / 1 for an integer type; a value keeps its exact value (a narrower
        float is a rounding, accounted for outside the schedule); a bit cast is not modelled."""
        if bitcast:
            raise NotModelled("a bit cast (a rounding helper missing from ROUNDING?)")
        if self.a.dtype == bool and dtype in ("int32", "int64"):
            return Tile(self.a.astype(np.int64), self.ring)
        return self


class SharedTile:
    """A shared-memory buffer of ``shape`` (one tile); ``transposed`` views it through ``permute((1, 0))``."""

    def __init__(self, shape: tuple[int, ...], dtype: str = "float32", base: SharedTile | None = None,
                 transposed: bool = False):
        self.shape, self.dtype, self.transposed = tuple(shape), dtype, transposed
        self.base = base if base is not None else self
        self.data: np.ndarray | None = None

    def permute(self, order: Any) -> SharedTile:
        if tuple(order) != (1, 0):
            raise NotModelled(f"a shared-memory permutation {tuple(order)}")
        return SharedTile(self.shape[::-1], self.dtype, self.base, not self.transposed)

    def store(self, value: Tile) -> None:
        a = value.a.T if self.transposed else value.a
        if a.shape != self.base.shape:
            raise NotModelled(f"a store of {a.shape} into a {self.base.shape} buffer")
        self.base.data = a.copy()

    def read(self) -> np.ndarray:
        if self.base.data is None:
            raise NotModelled("a read of shared memory never written")
        return self.base.data.T if self.transposed else self.base.data

    def load(self, layout: Any = None) -> np.ndarray:
        return self.read()

    def reinterpret(self, dtype: Any) -> SharedTile:
        return SharedTile(self.shape, str(dtype), self.base, self.transposed)


class Layout:
    """A layout argument: carries its keywords, means nothing to exact numbers."""

    def __init__(self, *args: Any, **kwargs: Any):
        self.__dict__.update(kwargs)

    def __getattr__(self, name: str) -> Any:
        return None


# ---------------------------------------------------------------------------------------------------- tl and gl
class ExactTiles:
    """The stand-ins of ``tl`` (:attr:`tl`) and ``gl`` (:attr:`gl`) over ``ring``, and the Gluon builtins."""

    def __init__(self, ring: Any):
        self.ring = ring
        self.tl = self._language()
        self.gl = self._language()
        for name in ("NVMMADistributedLayout", "DotOperandLayout", "NVMMASharedLayout", "SliceLayout",
                     "BlockedLayout"):
            setattr(self.gl, name, Layout)

    def tile(self, a: Any) -> Tile:
        return Tile(self.ring.reduce(np.asarray(a, dtype=self.ring.dtype)), self.ring)

    def _array(self, value: Any) -> Any:
        return _exact(value)

    def _language(self) -> types.SimpleNamespace:
        ring, wrap = self.ring, self._wrap

        def dot(a, b, acc=None, input_precision=None, **_):
            out = ring.matmul(_exact(a), _exact(b))
            return wrap(out if acc is None else ring.reduce(out + _exact(acc)))

        def reduce(x, axis, combine, **_):
            rows = np.moveaxis(x.a, axis, 0)
            return functools.reduce(combine, (Tile(row, ring) for row in rows[1:]), Tile(rows[0], ring))

        def reshape(x, shape, can_reorder=False, **_):
            if can_reorder:
                raise NotModelled("a reshape that may reorder elements")
            return wrap(np.reshape(x.a, tuple(shape)))

        return types.SimpleNamespace(
            constexpr=lambda value=None: value, static_range=range, int32="int32", int64="int64",
            float32="float32", float16="float16", bfloat16="bfloat16",
            arange=lambda start, end, layout=None: Tile(np.arange(start, end), ring),
            zeros=lambda shape, dtype=None, layout=None: Tile(ring.zeros(shape), ring),
            where=lambda c, x, y: wrap(np.where(_exact(c), _exact(x), _exact(y))),
            maximum=lambda x, y: wrap(np.maximum(_exact(x), _exact(y))),
            minimum=lambda x, y: wrap(np.minimum(_exact(x), _exact(y))),
            max=lambda x, axis=None, **_: wrap(np.max(x.a, axis=axis)),
            sum=lambda x, axis=None, **_: wrap(np.sum(x.a, axis=axis)),
            dot=dot, reduce=reduce, reshape=reshape,
            permute=lambda x, dims: wrap(np.transpose(x.a, tuple(dims))),
            trans=lambda x, *dims: wrap(np.transpose(x.a, tuple(dims) or None)),
            split=lambda x: (wrap(x.a[..., 0]), wrap(x.a[..., 1])),
            join=lambda x, y: wrap(np.stack([_exact(x), _exact(y)], axis=-1)),
            convert_layout=lambda x, layout=None, assert_trivial=False: x,
            load=_not_modelled("a load from global memory"), store=_not_modelled("a store to global memory"),
            exp=_not_modelled("exp"), exp2=_not_modelled("exp2"), sqrt=_not_modelled("sqrt"),
        )

    def _wrap(self, a: Any) -> Tile:
        a = np.asarray(a)
        return Tile(self.ring.reduce(a) if a.dtype != bool else a, self.ring)

    def builtins(self) -> dict[str, Any]:
        """The fused kernel's Gluon builtins (:data:`GLUON_BUILTINS`) with their exact meaning: barriers and fences
        order nothing here; ``warpgroup_mma(a, b, acc, use_acc)`` is ``a b (+ acc)`` with shared operands read
        through their views; ``warpgroup_mma_wait`` hands back its ``deps``; a reinterpretation views the same
        buffer."""
        ring, wrap = self.ring, self._wrap

        def operand(x):
            return x.read() if isinstance(x, SharedTile) else _exact(x)

        def warpgroup_mma(a, b, acc, use_acc=True, is_async=False, **_):
            out = ring.matmul(operand(a), operand(b))
            return wrap(ring.reduce(out + _exact(acc)) if use_acc else out)

        return dict(
            _barrier=lambda: None,
            fence_async_shared=lambda: None,
            warpgroup_mma=warpgroup_mma,
            warpgroup_mma_wait=lambda num_outstanding=0, deps=(): tuple(deps),
            _reinterpret=lambda smem, dtype, shape, layout: smem.reinterpret(dtype),
        )


def _not_modelled(what: str):
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise NotModelled(what)

    return refuse


# ---------------------------------------------------------------------------------------------------- rebuild
def _kernel_function(value: Any) -> Any:
    """The Python function of a kernel-module function (``@triton.jit``, ``@gluon.jit``, the interpreter's wrapper, or
    a plain function defined there), else None."""
    fn = getattr(value, "fn", value)
    if inspect.isfunction(fn) and (fn.__module__ or "").startswith(KERNEL_PACKAGE):
        return fn
    return None


def executable(function: Any, tiles: ExactTiles, _memo: dict | None = None) -> Any:
    """``function`` (a kernel function) rebuilt to run on ``tiles``' exact stand-ins: its globals are its module's,
    with ``tl`` / ``gl`` the stand-ins, the Gluon builtins exact, the :data:`ROUNDING` helpers the identity and every
    kernel function it names rebuilt the same way (looked up in its module now, so a function replaced there is
    the one run)."""
    memo = {} if _memo is None else _memo
    fn = _kernel_function(function)
    if fn is None:
        raise TypeError(f"{function!r} is not a function of the kernels' modules")
    if fn in memo:
        return memo[fn]
    names = dict(fn.__globals__)
    names.update(tl=tiles.tl, gl=tiles.gl)
    names.update({name: value for name, value in tiles.builtins().items() if name in names})
    rebuilt = types.FunctionType(fn.__code__, names, fn.__name__, fn.__defaults__, fn.__closure__)
    rebuilt.__kwdefaults__ = fn.__kwdefaults__
    memo[fn] = rebuilt
    for name in fn.__code__.co_names:
        if name in ROUNDING:
            names[name] = lambda x, *args, **kwargs: x
        elif name in names and _kernel_function(names[name]) is not None:
            names[name] = executable(names[name], tiles, memo)
    return rebuilt
