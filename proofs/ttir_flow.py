"""The memory, data and control ops of the TTIR model (:class:`~lumotree.proofs.ttir_model.KernelModel`, which
these methods are part of): loads, stores, atomics and descriptor accesses recorded with their masks; reductions,
scans and gathers as data; ``scf.if`` / ``scf.for`` / ``scf.while`` with their contexts and loop-carried values."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import z3

from .ttir_parse import Op, split_top
from .ttir_values import INT_BITS, Access, Unsupported, Val, names_in

__all__ = ["FlowOps"]


class FlowOps:
    """Handlers ``_op_<dialect>_<name>`` of the memory, data and control ops (mixed into ``KernelModel``)."""

    # ------------------------------------------------------------------------------------------------ memory
    def _op_tt_addptr(self, op: Op) -> None:
        ptr, offset = self._binary(op)
        self._set(op, Val(op.result_types[0][0], "ptr", 64, ptr.term + offset.term, base=ptr.base,
                          gathered=ptr.gathered or offset.gathered, cone=tuple(dict(ptr.cone + offset.cone).items())))

    def _mask(self, name: str | None) -> tuple[Any, bool, tuple]:
        if name is None:
            return self._bool(True), False, ()
        val = self._v(name)
        return val.term, val.gathered, val.cone

    def _record(self, kind: str, ptr: Val, mask_name: str | None, line: str) -> None:
        mask, mask_gathered, mask_cone = self._mask(mask_name)
        self.accesses.append(Access(kind, ptr.base, ptr.shape, mask, tuple(self.context),
                                    dict(ptr.cone + mask_cone), ptr.gathered or mask_gathered, line, offset=ptr.term))

    def _loaded(self, op: Op, base: str | None) -> Val:
        shape, elem = op.result_types[0]
        fact = self.params.get(base) if isinstance(base, str) else None
        if elem in INT_BITS and fact is not None and fact.contract is not None:
            lo, hi, iv = fact.contract
            return self._datum(shape, INT_BITS[elem], iv, gathered=False, lo=lo, hi=hi)
        return self._opaque(op, shape, elem)

    def _op_tt_load(self, op: Op) -> None:
        ptr = self._v(op.operands[0])
        mask = op.operands[1] if len(op.operands) > 1 else None
        self._record("load", ptr, mask, op.line)
        loaded = self._loaded(op, ptr.base)
        if mask is not None and loaded.kind == "int":  # masked-off lanes hold `other` (or anything without one)
            other = self._v(op.operands[2]) if len(op.operands) > 2 else self._opaque(op, *op.result_types[0])
            iv = (min(loaded.iv[0], other.iv[0]), max(loaded.iv[1], other.iv[1])) if other.iv else None
            loaded = replace(loaded, term=z3.If(self._v(mask).term, loaded.term, other.term), iv=iv,
                             gathered=loaded.gathered or other.gathered or self._v(mask).gathered)
        self._set(op, loaded)

    def _op_tt_store(self, op: Op) -> None:
        self._record("store", self._v(op.operands[0]), op.operands[2] if len(op.operands) > 2 else None, op.line)

    def _op_tt_atomic_rmw(self, op: Op) -> None:
        self._record("atomic", self._v(op.operands[0]), op.operands[2] if len(op.operands) > 2 else None, op.line)
        self._set(op, self._loaded(op, None))

    def _op_tt_atomic_cas(self, op: Op) -> None:
        self._record("atomic", self._v(op.operands[0]), None, op.line)
        self._set(op, self._loaded(op, None))

    def _descriptor(self, op: Op, kind: str) -> None:
        desc = self._v(op.operands[0])
        inside = op.body[op.body.index("[") + 1: op.body.index("]")]
        coords = [self._v(name) for name in split_top(inside)]
        cone = dict(c for v in coords for c in v.cone)
        self.accesses.append(Access(kind, desc.base, (), self._bool(True), tuple(self.context), cone,
                                    any(v.gathered for v in coords), op.line, coords=[v.term for v in coords]))

    def _op_tt_descriptor_load(self, op: Op) -> None:
        self._descriptor(op, "descriptor load")
        self._set(op, self._opaque(op, *op.result_types[0]))

    def _op_tt_descriptor_store(self, op: Op) -> None:
        self._descriptor(op, "descriptor store")

    # ------------------------------------------------------------------------------------------------ data
    def _reduce_lanes(self, val: Val, axis: int) -> tuple[tuple[int, Any], ...]:
        """The operand's cone with the reduced lane a bounded free symbol and the lanes after it moved down."""
        symbol = z3.Int(self._fresh("reduced"), self.ctx)
        self.free.append((symbol, 0, val.shape[axis] - 1))
        mapping = {axis: symbol} | {i: self.lanes[i - 1] for i in range(axis + 1, len(val.shape))}
        return tuple((i, self._rename(t, mapping)) for i, t in val.cone)

    def _combiner(self, op: Op) -> str:
        body = [o.name for o in op.regions[0] if not o.name.endswith(".return")]
        return body[-1] if len(body) == 1 else "other"

    def _op_tt_reduce(self, op: Op) -> None:
        vals = [self._v(n) for n in op.operands]
        axis = int(re.search(r"axis = (\d+)", op.body).group(1))
        combiner, n = self._combiner(op), vals[0].shape[axis]
        out = []
        for val, (shape, elem) in zip(vals, op.result_types):
            if elem not in INT_BITS or val.kind != "int":
                out.append(self._opaque(op, shape, elem))
                continue
            iv = None
            if val.iv and combiner == "arith.addi":
                iv = (min(val.iv[0], n * val.iv[0]), max(val.iv[1], n * val.iv[1]))
            elif val.iv and combiner in ("arith.maxsi", "arith.minsi", "arith.maxui", "arith.minui"):
                iv = val.iv
            datum = self._datum(shape, INT_BITS[elem], iv, True)
            out.append(replace(datum, cone=self._reduce_lanes(val, axis)))
        self._set(op, *out)

    def _op_tt_scan(self, op: Op) -> None:
        vals = [self._v(n) for n in op.operands]
        axis = int(re.search(r"axis = (\d+)", op.body).group(1))
        out = []
        for val, (shape, elem) in zip(vals, op.result_types):
            iv = None
            if val.kind == "int" and val.iv and self._combiner(op) == "arith.addi":
                n = val.shape[axis]
                iv = (min(val.iv[0], n * val.iv[0]), max(val.iv[1], n * val.iv[1]))
            out.append(self._opaque(op, shape, elem, iv=iv))
        self._set(op, *out)

    def _op_tt_gather(self, op: Op) -> None:
        src = self._v(op.operands[0])
        self._set(op, self._opaque(op, *op.result_types[0], iv=src.iv if src.kind == "int" else None))

    # ------------------------------------------------------------------------------------------------ control
    def _op_scf_if(self, op: Op) -> None:
        cond = self._v(op.operands[0])
        branches = []
        for index, region in enumerate(op.regions):
            self.context.append(cond.term if index == 0 else z3.Not(cond.term))
            branches.append(self._run(region) or [])
            self.context.pop()
        if not op.results:
            return
        then_vals, else_vals = branches[0], branches[1] if len(branches) > 1 else branches[0]
        out = []
        for a, b, (shape, elem) in zip(then_vals, else_vals, op.result_types):
            if a.kind in ("int", "bool") and b.kind == a.kind:
                iv = (min(a.iv[0], b.iv[0]), max(a.iv[1], b.iv[1])) if a.iv and b.iv else None
                out.append(Val(shape, a.kind, a.bits, z3.If(cond.term, a.term, b.term), iv=iv,
                               gathered=a.gathered or b.gathered, cone=tuple(dict(a.cone + b.cone).items())))
            elif a.kind == "ptr" and b.kind == "ptr":
                out.append(self._merge_pointers(cond.term, a, b, shape))
            else:
                out.append(self._opaque(op, shape, elem))
        self._set(op, *out)

    def _op_scf_for(self, op: Op) -> None:
        head = op.body.split(" {")[0]
        match = re.match(r"(%[\w.$-]+) = (%[\w.$#-]+) to (%[\w.$#-]+) step (%[\w.$#-]+)", head)
        iv_name, lb, ub, step = match.group(1), *(self._v(n) for n in match.group(2, 3, 4))
        carried = re.findall(r"(%[\w.$-]+) = (%[\w.$#-]+)", head[match.end():])
        if not self._positive(step):
            raise Unsupported(f"a loop whose step is not a positive constant: {op.line}")
        k = z3.Int(self._fresh("trip"), self.ctx)
        current = lb.term + k * step.term
        hi = ub.iv[1] - 1 if ub.iv else None
        iv = (lb.iv[0], max(lb.iv[0], hi)) if lb.iv and hi is not None else None
        self.values[iv_name] = Val((), "int", lb.bits, current, iv=iv, gathered=lb.gathered or ub.gathered)
        inits = [self._v(init) for _, init in carried]
        strides = self._loop_strides(op, [name for name, _ in carried], inits)
        trips = z3.If(ub.term > lb.term, (ub.term - lb.term + step.term - 1) / step.term, 0)
        after = []
        for (name, _), init, stride, (shape, elem) in zip(carried, inits, strides, op.result_types):
            if stride is None:
                self.values[name] = self._opaque(op, shape, elem)
                after.append(self._opaque(op, shape, elem))
                continue
            term, cone = stride
            self.values[name] = replace(init, term=init.term + k * term, iv=None, cone=init.cone + cone)
            after.append(replace(init, term=init.term + trips * term, iv=None, cone=init.cone + cone,
                                 gathered=init.gathered or lb.gathered or ub.gathered))
        self.context += [k >= 0, current < ub.term]
        self._run(op.regions[0])
        del self.context[-2:]
        self._set(op, *after)

    def _loop_strides(self, op: Op, names: list[str], inits: list[Val]) -> list[tuple[Any, tuple] | None]:
        """Per carried value: ``(stride, cone)`` if each iteration adds the same loop-invariant amount (found by a
        first run of the body with the carried values as symbols; its accesses are dropped), else None."""
        first, accesses = self._count, len(self.accesses)
        symbols = []
        for name, init in zip(names, inits):
            symbol = z3.Int(self._fresh("carried"), self.ctx)
            symbols.append(symbol)
            if init.kind in ("ptr", "int"):
                self.values[name] = replace(init, term=symbol, iv=None, cone=())
            else:
                self.values[name] = init
        self.context.append(self._bool(False))  # nothing in this run is claimed
        yields = self._run(op.regions[0]) or []
        self.context.pop()
        del self.accesses[accesses:]
        out: list[tuple[Any, tuple] | None] = []
        for symbol, init, new in zip(symbols, inits, yields):
            if init.kind not in ("ptr", "int") or new.kind != init.kind or new.base != init.base:
                out.append(None)
                continue
            stride = z3.simplify(new.term - symbol)
            if any(self._is_new(name, first) for name in names_in(stride)):
                out.append(None)
                continue
            cone = tuple((i, t) for i, t in new.cone if not any(self._is_new(n, first) for n in names_in(t)))
            out.append((stride, cone))
        return out

    @staticmethod
    def _is_new(name: str, first: int) -> bool:
        match = re.fullmatch(r"(?:data|carried|trip|reduced|flag)(\d+)", name)
        return match is not None and int(match.group(1)) > first

    def _op_scf_while(self, op: Op) -> None:
        inits = [self._v(n) for n in re.findall(r"= (%[\w.$#-]+)", op.body.split(" {")[0])]
        for region, args in zip(op.regions, op.region_args):
            for name, init in zip(args, inits):
                self.values[name] = self._opaque(op, init.shape, "i32" if init.kind == "int" else "f32")
            inits = self._run(region) or inits
        self._set(op, *[self._opaque(op, s, e) for s, e in op.result_types])
