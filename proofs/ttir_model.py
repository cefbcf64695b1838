r"""Z3 terms of a kernel's index arithmetic, read from its TTIR: every memory access with its address, mask and the
integer ops its address is computed from.

Integer model: a value is a Z3 integer (unbounded): its mathematical value, which is the machine's as long as no op
before it overflowed, and that is exactly what the claims then state, op by op. A tensor value is one term over
*lane* symbols, one per dimension (``tt.make_range`` is ``start + lane0``; ``tt.expand_dims``, ``tt.broadcast``,
``tt.trans`` rename lanes; a reduction turns the reduced lane into a bounded free symbol). Pointers are an argument
and an element offset (``tt.addptr`` adds). Program ids are symbols below the grid; loop induction variables
``lb + k step`` with ``k >= 0`` below the upper bound (in the loop's context only); an ``scf.if`` branch holds under
its condition. A pointer or integer carried by a loop that adds a loop-invariant step is ``init + k step`` (induction
variables of the pointer kind); other loop-carried integers are opaque.

*Data* values (loaded integers, reductions, scans, gathers, bit tricks, loop-carried values) are fresh uninterpreted
functions of the lanes, each within an interval: a loaded index within the range the launch code validates for that
tensor (a *contract*), anything else within the interval that interval arithmetic over its operands gives (else its
type's range). An access whose address or mask depends on data other than contract loads is *gathered*: its overflow
claims are made, its bounds claim is not (the scope says how many).

Claims, each an unsat negation under the launch's premises: (a) every integer op (``addi, subi, muli, shli``) in the
cone of an address, a mask or a descriptor coordinate stays in its type's signed range, and every ``trunci`` keeps
its value (first for every lane; where that fails, for the lanes the access's mask lets through); (b) every access a
mask lets through lies in its tensor's span (pointers), or starts inside the tensor (descriptor coordinates: the
hardware clips the block's tail).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import z3

from .ttir_flow import FlowOps
from .ttir_parse import Kernel, Op
from .ttir_values import INT_BITS, MAX_RANK, Access, ConeOp, ParamFact, Unsupported, Val, names_in, type_range

__all__ = ["Val", "Access", "ConeOp", "ParamFact", "KernelModel", "Unsupported", "names_in"]


def _truncated(a: int, b: int) -> int:
    """``a / b`` rounded toward zero (``arith.divsi``), exactly; ``b > 0``."""
    return a // b if a >= 0 else -((-a) // b)


class KernelModel(FlowOps):
    """Runs the TTIR of one kernel over Z3 terms. ``params``: name -> :class:`ParamFact`; ``pids``: the program id
    symbols (x, y, z) with their numeric intervals."""

    def __init__(self, kernel: Kernel, params: dict[str, ParamFact], pids: list[tuple[Any, tuple[int, int]]],
                 ctx: Any):
        self.ctx = ctx
        self.lanes = [z3.Int(f"lane{i}", ctx) for i in range(MAX_RANK)]
        self.params = params
        self.pids = pids
        self.values: dict[str, Val] = {}
        self.accesses: list[Access] = []
        self.cone_ops: dict[int, ConeOp] = {}
        self.free: list[tuple[Any, int, int]] = []  # bounded free symbols (reduced lanes): always premises
        self.data: dict[Any, tuple[Any, Any]] = {}  # data function -> (lo, hi) terms
        self.context: list[Any] = []
        self._count = 0
        for name, (shape, elem) in kernel.params:
            self.values["%" + name] = self._param(name, elem)
        self._run(kernel.ops)

    # ------------------------------------------------------------------------------------------------ values
    def _int(self, value: int) -> Any:
        return z3.IntVal(value, self.ctx)

    def _bool(self, value: bool) -> Any:
        return z3.BoolVal(value, self.ctx)

    def _fresh(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def _param(self, name: str, elem: str) -> Val:
        fact = self.params.get(name)
        if elem == "ptr":
            return Val((), "ptr", 64, self._int(0), base=name)
        if elem == "desc":
            return Val((), "desc", base=name)
        if elem in INT_BITS:
            if fact is None or fact.kind != "int":
                raise Unsupported(f"no value for the integer parameter {name}")
            return Val((), "int", INT_BITS[elem], fact.term, iv=fact.iv)
        if elem == "i1":
            return Val((), "bool", 1, z3.Bool(name, self.ctx))
        return Val((), "float")

    def _datum(self, shape: tuple[int, ...], bits: int, iv: tuple[int, int] | None, gathered: bool = True,
               lo: Any = None, hi: Any = None) -> Val:
        """A fresh data value: an uninterpreted function of the lanes within [lo, hi] (terms) or ``iv``."""
        iv = iv if iv is not None else type_range(bits)
        func = z3.Function(self._fresh("data"), *([z3.IntSort(self.ctx)] * (len(shape) + 1)))
        self.data[func] = (lo if lo is not None else self._int(iv[0]), hi if hi is not None else self._int(iv[1]))
        return Val(shape, "int", bits, func(*self.lanes[: len(shape)]), iv=iv, gathered=gathered)

    def _opaque(self, op: Op, shape: tuple[int, ...], elem: str, gathered: bool = True,
                iv: tuple[int, int] | None = None) -> Val:
        if elem in INT_BITS:
            return self._datum(shape, INT_BITS[elem], iv, gathered)
        if elem == "i1":
            return Val(shape, "bool", 1, z3.Bool(self._fresh("flag"), self.ctx), gathered=gathered)
        if elem in ("ptr", "desc"):
            raise Unsupported(f"a pointer the model cannot follow: {op.line}")
        return Val(shape, "float")

    def _v(self, name: str) -> Val:
        if name not in self.values:
            raise Unsupported(f"the value {name} is used before it is defined")
        return self.values[name]

    def _set(self, op: Op, *vals: Val) -> None:
        for name, val in zip(op.results, vals):
            self.values[name] = val

    # ------------------------------------------------------------------------------------------------ lanes
    def _rename(self, term: Any, mapping: dict[int, Any]) -> Any:
        if term is None or not mapping:
            return term
        return z3.substitute(term, *[(self.lanes[i], new) for i, new in mapping.items()])

    def _relane(self, val: Val, shape: tuple[int, ...], mapping: dict[int, Any]) -> Val:
        cone = tuple((i, self._rename(t, mapping)) for i, t in val.cone)
        return replace(val, shape=shape, term=self._rename(val.term, mapping), cone=cone)

    # ------------------------------------------------------------------------------------------------ ops
    def _run(self, ops: list[Op]) -> list[Val] | None:
        """Evaluate a block; returns the values it yields (``scf.yield`` / ``scf.condition`` / reduce return)."""
        for op in ops:
            if op.name in ("scf.yield", "tt.reduce.return", "tt.scan.return"):
                return [self._v(n) for n in op.operands]
            if op.name == "scf.condition":
                return [self._v(n) for n in op.operands]
            if op.name == "tt.return":
                return None
            handler = getattr(self, "_op_" + op.name.replace(".", "_"), None)
            if handler is not None:
                handler(op)
            elif op.name in ("gpu.barrier", "tt.assert", "tt.print"):
                continue
            else:
                self._set(op, *[self._opaque(op, s, e) for s, e in op.result_types])
        return None

    def _op_arith_constant(self, op: Op) -> None:
        shape, elem = op.result_types[0]
        text = op.body.split(" : ")[0].strip()
        text = re.sub(r"^dense<(.*)>$", r"\1", text)
        if elem == "i1":
            self._set(op, Val(shape, "bool", 1, self._bool(text == "true")))
        elif elem in INT_BITS and re.fullmatch(r"-?\d+", text):
            value = int(text)
            self._set(op, Val(shape, "int", INT_BITS[elem], self._int(value), iv=(value, value)))
        else:
            self._set(op, self._opaque(op, shape, elem, gathered=False))

    def _op_tt_make_range(self, op: Op) -> None:
        start = int(re.search(r"start = (-?\d+)", op.body).group(1))
        end = int(re.search(r"end = (-?\d+)", op.body).group(1))
        self._set(op, Val((end - start,), "int", 32, start + self.lanes[0], iv=(start, end - 1)))

    def _op_tt_get_program_id(self, op: Op) -> None:
        axis = "xyz".index(op.body.split()[0])
        symbol, iv = self.pids[axis]
        self._set(op, Val((), "int", 32, symbol, iv=iv))

    def _op_tt_splat(self, op: Op) -> None:
        self._set(op, replace(self._v(op.operands[0]), shape=op.result_types[0][0]))

    _op_tt_broadcast = _op_tt_splat

    def _op_tt_expand_dims(self, op: Op) -> None:
        val = self._v(op.operands[0])
        axis = int(re.search(r"axis = (\d+)", op.body).group(1))
        mapping = {i: self.lanes[i + 1] for i in range(axis, len(val.shape))}
        self._set(op, self._relane(val, op.result_types[0][0], mapping))

    def _op_tt_trans(self, op: Op) -> None:
        val = self._v(op.operands[0])
        order = [int(x) for x in re.search(r"order = array<i32: ([\d, ]+)>", op.body).group(1).split(",")]
        mapping = {old: self.lanes[new] for new, old in enumerate(order)}
        self._set(op, self._relane(val, op.result_types[0][0], mapping))

    def _op_tt_reshape(self, op: Op) -> None:
        val = self._v(op.operands[0])
        shape = op.result_types[0][0]
        if [d for d in val.shape if d != 1] != [d for d in shape if d != 1] or val.kind not in ("int", "bool"):
            self._set(op, self._opaque(op, shape, op.result_types[0][1], iv=val.iv) if val.kind == "int"
                      else self._opaque(op, shape, op.result_types[0][1]))
            return
        old = [i for i, d in enumerate(val.shape) if d != 1]
        new = [i for i, d in enumerate(shape) if d != 1]
        self._set(op, self._relane(val, shape, {o: self.lanes[n] for o, n in zip(old, new) if o != n}))

    def _binary(self, op: Op) -> tuple[Val, Val]:
        return self._v(op.operands[0]), self._v(op.operands[1])

    def _combine(self, op: Op, term: Any, iv: tuple[int, int] | None, *vals: Val, claim: bool = True) -> Val:
        shape, elem = op.result_types[0]
        bits = INT_BITS.get(elem, 1)
        cone = dict(c for v in vals for c in v.cone)
        if claim and elem in INT_BITS:
            ident = len(self.cone_ops)
            self.cone_ops[ident] = ConeOp(op.line, bits, term, shape, tuple(self.context))
            cone[ident] = term
        return Val(shape, "int" if elem in INT_BITS else "bool", bits, term, iv=iv,
                   gathered=any(v.gathered for v in vals), cone=tuple(cone.items()))

    def _op_arith_addi(self, op: Op) -> None:
        a, b = self._binary(op)
        iv = (a.iv[0] + b.iv[0], a.iv[1] + b.iv[1]) if a.iv and b.iv else None
        self._set(op, self._combine(op, a.term + b.term, iv, a, b))

    def _op_arith_subi(self, op: Op) -> None:
        a, b = self._binary(op)
        iv = (a.iv[0] - b.iv[1], a.iv[1] - b.iv[0]) if a.iv and b.iv else None
        self._set(op, self._combine(op, a.term - b.term, iv, a, b))

    def _op_arith_muli(self, op: Op) -> None:
        a, b = self._binary(op)
        iv = None
        if a.iv and b.iv:
            products = [x * y for x in a.iv for y in b.iv]
            iv = (min(products), max(products))
        self._set(op, self._combine(op, a.term * b.term, iv, a, b))

    def _positive(self, val: Val) -> bool:
        return val.iv is not None and val.iv[0] > 0

    def _op_arith_divsi(self, op: Op) -> None:
        a, b = self._binary(op)
        if not self._positive(b):
            self._set(op, self._datum(op.result_types[0][0], a.bits, None, True))
            return
        if a.iv and a.iv[0] >= 0:
            term = a.term / b.term
        else:
            term = z3.If(a.term >= 0, a.term / b.term, -((-a.term) / b.term))  # truncation toward zero
        iv = None
        if a.iv:
            quotients = [_truncated(x, y) for x in a.iv for y in b.iv]  # exact: floats lose bits past 2^53
            iv = (min(quotients), max(quotients))
        self._set(op, self._combine(op, term, iv, a, b, claim=False))

    _op_arith_divui = _op_arith_divsi

    def _op_arith_remsi(self, op: Op) -> None:
        a, b = self._binary(op)
        if not self._positive(b):
            self._set(op, self._datum(op.result_types[0][0], a.bits, None, True))
            return
        if a.iv and a.iv[0] >= 0:
            term = a.term % b.term
        else:
            term = z3.If(a.term >= 0, a.term % b.term, -((-a.term) % b.term))  # the sign of the dividend
        low = 0 if a.iv and a.iv[0] >= 0 else -(b.iv[1] - 1)
        self._set(op, self._combine(op, term, (low, b.iv[1] - 1), a, b, claim=False))

    _op_arith_remui = _op_arith_remsi

    def _op_arith_ceildivsi(self, op: Op) -> None:
        a, b = self._binary(op)
        if not self._positive(b) or not a.iv or a.iv[0] < 0:
            self._set(op, self._datum(op.result_types[0][0], a.bits, None, True))
            return
        term = (a.term + b.term - 1) / b.term
        self._set(op, self._combine(op, term, (0, -(-a.iv[1] // b.iv[0])), a, b, claim=False))

    def _op_arith_maxsi(self, op: Op) -> None:
        a, b = self._binary(op)
        iv = (max(a.iv[0], b.iv[0]), max(a.iv[1], b.iv[1])) if a.iv and b.iv else None
        self._set(op, self._combine(op, z3.If(a.term >= b.term, a.term, b.term), iv, a, b, claim=False))

    def _op_arith_minsi(self, op: Op) -> None:
        a, b = self._binary(op)
        iv = (min(a.iv[0], b.iv[0]), min(a.iv[1], b.iv[1])) if a.iv and b.iv else None
        self._set(op, self._combine(op, z3.If(a.term <= b.term, a.term, b.term), iv, a, b, claim=False))

    def _shift_amount(self, val: Val) -> int | None:
        return val.iv[0] if val.iv and val.iv[0] == val.iv[1] and 0 <= val.iv[0] < 63 else None

    def _op_arith_shli(self, op: Op) -> None:
        a, b = self._binary(op)
        k = self._shift_amount(b)
        if k is None:
            self._set(op, self._datum(op.result_types[0][0], a.bits, None, True))
            return
        iv = (a.iv[0] << k, a.iv[1] << k) if a.iv else None
        self._set(op, self._combine(op, a.term * 2**k, iv, a, b))

    def _op_arith_shrsi(self, op: Op) -> None:
        a, b = self._binary(op)
        k = self._shift_amount(b)
        if k is None:
            self._set(op, self._datum(op.result_types[0][0], a.bits, None, True))
            return
        iv = (a.iv[0] >> k, a.iv[1] >> k) if a.iv else None
        self._set(op, self._combine(op, a.term / 2**k, iv, a, b, claim=False))  # floor, as the arithmetic shift

    def _op_arith_shrui(self, op: Op) -> None:
        a, b = self._binary(op)
        if a.iv and a.iv[0] >= 0:
            self._op_arith_shrsi(op)
        else:
            self._set(op, self._datum(op.result_types[0][0], a.bits, None, True))

    def _bitwise(self, op: Op, fold: Any) -> None:
        a, b = self._binary(op)
        if a.kind == "bool":
            self._set(op, self._combine(op, fold(a.term, b.term), None, a, b, claim=False))
            return
        shape, elem = op.result_types[0]
        mask = next((v.iv[0] for v in (a, b) if v.iv and v.iv[0] == v.iv[1]), None)
        other = b if mask is not None and a.iv == (mask, mask) else a
        if op.name == "arith.andi" and mask is not None and mask >= 0:
            if mask & (mask + 1) == 0 and other.iv and other.iv[0] >= 0:  # x & (2^k - 1) = x mod 2^k
                self._set(op, self._combine(op, other.term % (mask + 1), (0, mask), a, b, claim=False))
            else:
                self._set(op, self._datum(shape, INT_BITS[elem], (0, mask), a.gathered or b.gathered))
            return
        self._set(op, self._datum(shape, INT_BITS[elem], None, True))

    def _op_arith_andi(self, op: Op) -> None:
        self._bitwise(op, z3.And)

    def _op_arith_ori(self, op: Op) -> None:
        self._bitwise(op, z3.Or)

    def _op_arith_xori(self, op: Op) -> None:
        self._bitwise(op, z3.Xor)

    _COMPARE = {"slt": lambda a, b: a < b, "sle": lambda a, b: a <= b, "sgt": lambda a, b: a > b,
                "sge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b}

    def _op_arith_cmpi(self, op: Op) -> None:
        predicate = op.body.split(",")[0].strip()
        a, b = self._binary(op)
        unsigned = {"ult": "slt", "ule": "sle", "ugt": "sgt", "uge": "sge"}
        if predicate in unsigned and a.iv and b.iv and min(a.iv[0], b.iv[0]) >= 0:
            predicate = unsigned[predicate]
        if predicate not in self._COMPARE:
            self._set(op, Val(op.result_types[0][0], "bool", 1, z3.Bool(self._fresh("flag"), self.ctx), gathered=True))
            return
        self._set(op, self._combine(op, self._COMPARE[predicate](a.term, b.term), None, a, b, claim=False))

    def _op_arith_select(self, op: Op) -> None:
        c, a, b = (self._v(n) for n in op.operands[:3])
        if a.kind == "float":
            self._set(op, replace(a, shape=op.result_types[0][0]))
            return
        if a.kind == "ptr":
            self._set(op, self._merge_pointers(c.term, a, b, op.result_types[0][0]))
            return
        iv = (min(a.iv[0], b.iv[0]), max(a.iv[1], b.iv[1])) if a.iv and b.iv else None
        val = self._combine(op, z3.If(c.term, a.term, b.term), iv, c, a, b, claim=False)
        self._set(op, replace(val, kind=a.kind, base=a.base, bits=a.bits))

    def _merge_pointers(self, cond: Any, a: Val, b: Val, shape: tuple[int, ...]) -> Val:
        """``cond ? a : b`` of two pointers: one base, or the (condition, argument) pairs of both."""
        def pairs(val: Val, guard: Any) -> list[tuple[Any, str]]:
            if isinstance(val.base, tuple):
                return [(z3.And(guard, c), name) for c, name in val.base]
            return [(guard, val.base)]

        base = a.base if a.base == b.base else tuple(pairs(a, cond) + pairs(b, z3.Not(cond)))
        return Val(shape, "ptr", 64, z3.If(cond, a.term, b.term), base=base, gathered=a.gathered or b.gathered,
                   cone=tuple(dict(a.cone + b.cone).items()))

    def _op_arith_extsi(self, op: Op) -> None:
        val = self._v(op.operands[0])
        shape, elem = op.result_types[0]
        if val.kind == "bool":
            self._set(op, replace(val, kind="int", bits=INT_BITS[elem], term=z3.If(val.term, -1, 0), iv=(-1, 0)))
        else:
            self._set(op, replace(val, bits=INT_BITS[elem], shape=shape))

    def _op_arith_extui(self, op: Op) -> None:
        val = self._v(op.operands[0])
        shape, elem = op.result_types[0]
        if val.kind == "bool":
            self._set(op, replace(val, kind="int", bits=INT_BITS[elem], term=z3.If(val.term, 1, 0), iv=(0, 1)))
        elif val.iv and val.iv[0] >= 0:
            self._set(op, replace(val, bits=INT_BITS[elem], shape=shape))
        else:
            self._set(op, self._datum(shape, INT_BITS[elem], (0, 2**val.bits - 1), val.gathered))

    def _op_arith_trunci(self, op: Op) -> None:
        val = self._v(op.operands[0])
        shape, elem = op.result_types[0]
        if elem == "i1" or val.kind != "int":
            self._set(op, self._opaque(op, shape, elem))
            return
        bits = INT_BITS[elem]
        ident = len(self.cone_ops)
        self.cone_ops[ident] = ConeOp(op.line, bits, val.term, shape, tuple(self.context), kind="trunc")
        self._set(op, replace(val, bits=bits, cone=val.cone + ((ident, val.term),)))
