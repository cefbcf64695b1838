r"""The index claims of one recorded launch, proved with Z3: the premises the launch gives, the kernel's TTIR read by
:class:`~lumotree.proofs.ttir_model.KernelModel`, one query per integer op and per access.

Premises (all integers exact): every symbolic size in its admitted range; every tensor the launch passes at most
:data:`MEMORY_BYTES` of storage (a physical bound: above any GPU's memory); every grid dimension within CUDA's
limits (x below ``2^31``, y and z at most 65535: the driver refuses larger grids); every extent the launch code
validates (``check_request_rows``: offsets within one request below ``2^31``) and every descriptor's dimensions
(``tma_possible``) within int32; at most ``P`` requests where the slots are validated distinct; each integer
argument equal to the polynomial the launch code computes it as; each program id below its grid dimension; each
loaded index within its *contract*, the range the launch code validates for that tensor (``slots`` in ``[0, P)``
and the like).

An integer argument Triton passes as ``i32`` (below ``2^31``) may reach ``2^31`` somewhere in the box; then the
kernel is also compiled with it as ``i64`` (the launch passes it so from there), and each variant is proved on its
side of ``2^31``. Arguments equal as polynomials in the sizes (the same row stride passed for q, k and v) cross
together: one pair of variants per distinct value, at most three.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import z3

from .exact import Z3_RLIMIT, z3_solver
from .kernel_ir import JitWorld, compile_ttir
from .kernel_launch import Dim, FittedLaunch
from .ttir_model import Access, KernelModel, ParamFact, Unsupported, names_in as _names
from .ttir_parse import parse_kernel

__all__ = ["MEMORY_BYTES", "GRID_LIMITS", "LaunchProof", "Box", "prove_launch"]

MEMORY_BYTES = 2**39  # 512 GiB: every tensor of a launch fits in one GPU's memory
GRID_LIMITS = (2**31 - 1, 65535, 65535)  # CUDA's largest grid (x, y, z)
I32_MAX = 2**31 - 1
SEARCH_LIMIT = 2**44
#: Z3 configurations for the nonlinear integer queries (products of symbolic sizes), tried in this order, each under
#: its share of the resource limit: a query one of them proves at once can send another wandering, and which one
#: depends on the query. Preprocessing first (simplify, propagate the values, solve the equations), Z3's defaults,
#: without the nlsat fallback, the older arithmetic solver; first with a fiftieth of the limit each, then the whole.
SOLVER_CONFIGS = tuple((tactic, options, limit) for limit in (Z3_RLIMIT // 50, Z3_RLIMIT)
                       for tactic, options in ((True, {}), (False, {}), (False, {"smt.arith.nl.nra": False}),
                                               (False, {"smt.arith.solver": 2})))


@dataclass
class Box:
    """The admitted sizes: each symbolic size's numeric range (``high`` from the premises where the size has none
    of its own) and the Z3 premises over their symbols."""

    dims: list[Dim]
    ranges: dict[str, tuple[int, int]]
    symbols: dict[str, Any]
    premises: list[Any]


def _largest(dim: Dim, launches: list[FittedLaunch], limits: list, dims: list[Dim]) -> int:
    """The largest value of ``dim`` (the others at their least) that keeps every tensor within memory, every grid
    dimension within its limit and every validated extent within int32."""
    def fits(value: int) -> bool:
        point = {d.name: d.low for d in dims} | {dim.name: value}
        if any(poly.at(point) > I32_MAX for _, poly in limits):
            return False
        for launch in launches:
            for path, poly in launch.numbers.items():
                if path[-1] == "storage_bytes" and poly.at(point) > MEMORY_BYTES:
                    return False
                if path[0] == "grid" and poly.at(point) > GRID_LIMITS[path[1]]:
                    return False
        return True

    if fits(SEARCH_LIMIT):
        raise ValueError(f"nothing bounds the size {dim.name}: give it a largest value")
    low, high = dim.low, SEARCH_LIMIT
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def make_box(dims: list[Dim], launches: list[FittedLaunch], limits: list, relations: list, ctx: Any) -> Box:
    """The box of sizes of these launches and its premises (module docstring); ``limits``: the extents the launch
    validates (:func:`~lumotree.proofs.kernel_launch.fit`); ``relations``: functions of the size symbols giving
    premises the launch's data validation implies (B <= P for distinct slots)."""
    symbols = {d.name: z3.Int(d.name, ctx) for d in dims}
    ranges, premises = {}, []
    for d in dims:
        high = d.high if d.high is not None else _largest(d, launches, limits, dims)
        ranges[d.name] = (d.low, high)
        premises += [symbols[d.name] >= d.low, symbols[d.name] <= high]
    for launch in launches:
        for path, poly in launch.numbers.items():
            if path[-1] == "storage_bytes":
                premises.append(poly.z3(symbols, ctx) <= MEMORY_BYTES)
            if path[0] == "grid":
                premises += [poly.z3(symbols, ctx) >= 1, poly.z3(symbols, ctx) <= GRID_LIMITS[path[1]]]
            if path[0] == "arg" and len(path) == 4 and path[2] == "shape":  # descriptors: checks.tma_possible
                premises.append(poly.z3(symbols, ctx) <= I32_MAX)
    premises += [poly.z3(symbols, ctx) <= I32_MAX for _, poly in limits]
    premises += [relation(symbols) for relation in relations]
    return Box(dims, ranges, symbols, premises)


@dataclass
class LaunchProof:
    """The outcome for one launch: ``status`` (proved / refuted / unknown), what was claimed (``ops``: integer ops
    in address cones, ``accesses``, ``bounded``: accesses whose bounds were claimed, ``gathered``: accesses through
    gathered indices, overflow only), and a counterexample or reason."""

    kernel: str
    status: str = "proved"
    ops: int = 0
    accesses: int = 0
    bounded: int = 0
    gathered: int = 0
    variants: int = 1
    detail: str = ""
    counterexample: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)


def _i32_crossings(launch: FittedLaunch, signature: dict, box: Box, text: str) -> list[str]:
    """Integer parameters passed as i32 at the recorded sizes that reach 2^31 inside the box and are used other than
    widened to i64 (a parameter only ever widened computes the same values as the i64 one Triton passes from 2^31:
    the model's integers are exact, so one variant covers both sides)."""
    out = []
    for name, kind in signature.items():
        poly = launch.numbers.get(("arg", name))
        if kind == "i32" and poly is not None and poly.range(box.ranges)[1] > I32_MAX:
            uses = [line for line in text.splitlines() if re.search(rf"%{re.escape(name)}\b(?![.#])", line)
                    and not line.strip().startswith("tt.func")]
            if any("arith.extsi" not in line for line in uses):
                out.append(name)
    return out


def _descriptor_param(name: str, launch: FittedLaunch) -> tuple | None:
    """``X.shape.i`` / ``X.stride.i``: the path of that number of descriptor argument X."""
    parts = name.split(".")
    if len(parts) == 3 and parts[1] in ("shape", "stride"):
        return ("arg", parts[0], parts[1], int(parts[2]))
    return None


def _facts(launch: FittedLaunch, kernel_params: list, box: Box, contracts: dict, ctx: Any,
           side: dict[str, bool]) -> tuple[dict[str, ParamFact], list[Any]]:
    facts, premises = {}, []
    for name, (_, elem) in kernel_params:
        path = _descriptor_param(name, launch) or ("arg", name)
        if elem == "ptr":
            span = launch.numbers.get(("arg", name, "span"))
            contract = None
            if name in contracts:
                lo, hi = (b if z3.is_expr(b) else z3.IntVal(b, ctx) for b in contracts[name](box.symbols))
                contract = (lo, hi, (_numeric(lo, box, min), _numeric(hi, box, max)))
            facts[name] = ParamFact("ptr", span.z3(box.symbols, ctx) if span else None, contract=contract)
        elif elem == "desc":
            facts[name] = ParamFact("desc")
        elif elem.startswith("i") and elem != "i1":
            poly = launch.numbers.get(path)
            if poly is None:
                raise Unsupported(f"the launch passes no integer for {name}")
            symbol = poly.z3(box.symbols, ctx)  # the value itself: the solver sees the sizes it is made of
            low, high = poly.range(box.ranges)
            if name in side:
                premises.append(symbol <= I32_MAX if side[name] else symbol > I32_MAX)
                low, high = (low, min(high, I32_MAX)) if side[name] else (max(low, I32_MAX + 1), high)
            facts[name] = ParamFact("int", symbol, iv=(low, high))
    return facts, premises


def _numeric(term: Any, box: Box, pick: Any) -> int:
    names = sorted(box.ranges)
    values = []
    for corner in itertools.product(*(box.ranges[n] for n in names)):
        value = z3.simplify(z3.substitute(term, *[(box.symbols[n], z3.IntVal(v, term.ctx))
                                                   for n, v in zip(names, corner)]))
        values.append(value.as_long())
    return pick(values)


class _Prover:
    """The queries of one compiled variant of a launch."""

    def __init__(self, model: KernelModel, premises: list[Any], launch: FittedLaunch, box: Box, ctx: Any):
        self.model, self.premises, self.launch, self.box, self.ctx = model, premises, launch, box, ctx
        self.premise_names = [(p, _names(p)) for p in premises]
        self._bounds: dict[int, list[Any]] = {}

    def _support(self, terms: list[Any]) -> list[Any]:
        """Range premises of the data values and reduced lanes the terms mention."""
        out = []
        free = {str(s): (s, lo, hi) for s, lo, hi in self.model.free}
        for term in _subterms(terms):
            decl = term.decl()
            if decl in self.model.data:
                lo, hi = self.model.data[decl]
                out += [term >= lo, term <= hi]
            elif term.num_args() == 0 and str(term) in free:
                symbol, lo, hi = free[str(term)]
                out += [symbol >= lo, symbol <= hi]
        return out

    def _relevant(self, terms: list[Any]) -> list[Any]:
        """The premises connected to the terms through shared symbols (each once)."""
        wanted = set().union(*(_names(t) for t in terms)) if terms else set()
        out, seen, grown = [], set(), True
        while grown:
            grown = False
            for premise, names in self.premise_names:
                if names & wanted and premise.get_id() not in seen:
                    seen.add(premise.get_id())
                    out.append(premise)
                    if not names <= wanted:
                        wanted |= names
                        grown = True
        return out

    def _lanes(self, shape: tuple[int, ...]) -> list[Any]:
        return [c for i, n in enumerate(shape) for c in (self.model.lanes[i] >= 0, self.model.lanes[i] <= n - 1)]

    def solve(self, assumptions: list[Any], claims: list[tuple[str, Any]],
              lemmas: bool = True) -> tuple[str, Any, str | None]:
        """Prove ``claims`` under the premises and ``assumptions``: ``(status, model or reason, failed claim)``.
        Where a quotient by a symbolic size appears, a bound on it (proved on its own) joins the assumptions."""
        goal = z3.And(*[c for _, c in claims]) if claims else z3.BoolVal(True, self.ctx)
        local = assumptions + self._support(assumptions + [goal])
        if lemmas:
            local += self._quotient_bounds(local + [goal])
        status, found = self._check([*self._relevant(local + [goal]), *local, z3.Not(goal)])
        if status == "refuted":
            failed = next((what for what, c in claims if z3.is_false(found.eval(c, model_completion=True))), None)
            return "refuted", found, failed
        return status, found, None

    def _check(self, query: list[Any], configs: tuple = None) -> tuple[str, Any]:
        reason = None
        for preprocess, options, share in configs or SOLVER_CONFIGS:
            if preprocess:
                solver = z3.Then("simplify", "propagate-values", "solve-eqs", "smt", ctx=self.ctx).solver()
            else:
                solver = z3_solver(self.ctx)
            solver.set("rlimit", share)
            for key, value in options.items():
                solver.set(key, value)
            solver.add(*query)
            verdict = solver.check()
            if verdict == z3.unsat:
                return "proved", None
            if verdict == z3.sat:
                return "refuted", solver.model()
            reason = solver.reason_unknown()
        return "unknown", reason

    def _quotient_bounds(self, terms: list[Any]) -> list[Any]:
        """``q <= S - 1`` for each quotient ``q = a div d`` by a non-constant ``d`` in the terms, with ``S`` the
        first size symbol for which Z3 proves it (the layer index of a launch over stacked layers, say)."""
        out = []
        for quotient in _quotients(terms):
            key = quotient.get_id()
            if key not in self._bounds:
                self._bounds[key] = []
                for symbol in self.box.symbols.values():
                    claim = quotient <= symbol - 1
                    status, _, _ = self.solve([], [("quotient bound", claim)], lemmas=False)
                    if status == "proved":
                        self._bounds[key] = [claim]
                        break
            out += self._bounds[key]
        return out

    def op_claim(self, ident: int, term: Any) -> tuple[str, Any]:
        op = self.model.cone_ops[ident]
        low, high = (-(2 ** (op.bits - 1)), 2 ** (op.bits - 1) - 1)
        what = ("the value fits i%d: " if op.kind == "trunc" else "no i%d overflow: ") % op.bits + op.line
        return what, z3.Implies(z3.And(*op.context, self.ctx), z3.And(term >= low, term <= high))

    def bounds_claims(self, access: Access) -> list[tuple[str, Any]]:
        if access.gathered:
            return []
        if access.coords:
            out = []
            for i, coord in enumerate(access.coords):
                shape = self.model.params.get(f"{access.base}.shape.{i}")
                if shape is None:
                    raise Unsupported(f"no shape for {access.base}")
                out.append((f"coordinate {i} inside {access.base}: {access.line}",
                            z3.And(coord >= 0, coord < shape.term)))
            return out
        bases = access.base if isinstance(access.base, tuple) else ((z3.BoolVal(True, self.ctx), access.base),)
        claims = []
        for condition, name in bases:
            span = self.model.params[name].term
            if span is None:
                raise Unsupported(f"the launch passes no tensor for {name} ({access.line})")
            claims.append((f"inside {name}: {access.line}",
                           z3.Implies(condition, z3.And(access.offset >= 0, access.offset < span))))
        return claims


def _subterms(terms: list[Any]) -> Iterator[Any]:
    """Every distinct application in the terms and below them, once, depth first."""
    seen, stack = set(), list(terms)
    while stack:
        term = stack.pop()
        if term.get_id() in seen:
            continue
        seen.add(term.get_id())
        if z3.is_app(term):
            yield term
            stack.extend(term.children())


def _quotients(terms: list[Any]) -> list[Any]:
    """The integer quotients by a non-constant divisor in the terms."""
    return [term for term in _subterms(terms)
            if term.decl().kind() == z3.Z3_OP_IDIV and not z3.is_int_value(term.arg(1))]


def _counterexample(prover: _Prover, model: Any, failed: str, shape: tuple[int, ...]) -> dict[str, Any]:
    def value(term: Any) -> Any:
        v = model.eval(term, model_completion=True)
        return v.as_long() if z3.is_int_value(v) else str(v)

    example = {"kernel": prover.launch.name, "claim": failed}
    example |= {name: value(symbol) for name, symbol in prover.box.symbols.items()}
    example |= {f"program_id {'xyz'[i]}": value(s) for i, (s, _) in enumerate(prover.model.pids)}
    example |= {f"lane {i}": value(prover.model.lanes[i]) for i in range(len(shape))}
    return example


def _prove_variant(world: JitWorld, launch: FittedLaunch, box: Box, contracts: dict, ctx: Any,
                   side: dict[str, bool], result: LaunchProof) -> None:
    args, kwargs = launch.sample.args, dict(launch.sample.kwargs)
    if side:  # the i64 variant: Triton's signature for the arguments at 2^31 and above
        names = launch.kernel.arg_names
        args = tuple(2**31 if names[i] in side and not side[names[i]] else a for i, a in enumerate(args))
        kwargs = {k: 2**31 if k in side and not side[k] else v for k, v in kwargs.items()}
    text, _ = compile_ttir(world, launch.kernel, args, kwargs)
    kernel = parse_kernel(text)
    facts, premises = _facts(launch, kernel.params, box, contracts, ctx, side)
    pids = []
    for axis in range(3):
        grid = launch.numbers.get(("grid", axis))
        symbol = z3.Int(f"program_id_{'xyz'[axis]}", ctx)
        bound = grid.z3(box.symbols, ctx) if grid else z3.IntVal(1, ctx)
        premises += [symbol >= 0, symbol < bound]
        pids.append((symbol, (0, (grid.range(box.ranges)[1] if grid else 1) - 1)))
    model = KernelModel(kernel, facts, pids, ctx)
    prover = _Prover(model, box.premises + premises, launch, box, ctx)
    used = {i for access in model.accesses for i in access.cone}
    everywhere = set()
    for ident in sorted(used):  # first for every lane of the op
        op = model.cone_ops[ident]
        status, _, _ = prover.solve(prover._lanes(op.shape), [prover.op_claim(ident, op.term)])
        if status == "proved":
            everywhere.add(ident)
    result.ops += len(used)
    for access in model.accesses:
        claims = [prover.op_claim(i, t) for i, t in access.cone.items() if i not in everywhere]
        claims += prover.bounds_claims(access)
        result.accesses += 1
        result.gathered += access.gathered
        result.bounded += not access.gathered
        assumptions = prover._lanes(access.shape) + list(access.context) + [access.mask]
        status, found, failed = prover.solve(assumptions, claims)
        if status == "refuted":
            result.status, result.detail = "refuted", failed
            result.counterexample = _counterexample(prover, found, failed, access.shape)
            return
        if status == "unknown":
            result.status, result.detail = "unknown", f"Z3 unknown ({found}) on {access.line}"
            return


def prove_launch(world: JitWorld, launch: FittedLaunch, box: Box, contracts: dict, ctx: Any) -> LaunchProof:
    """Every claim of one launch over the box (module docstring); ``contracts``: parameter name -> function of the
    size symbols giving the (lo, hi) its elements are validated to lie in."""
    result = LaunchProof(launch.name)
    text, signature = compile_ttir(world, launch.kernel, launch.sample.args, launch.sample.kwargs)
    crossings = _i32_crossings(launch, signature, box, text)
    groups: dict[str, list[str]] = {}  # arguments equal as polynomials cross 2^31 together
    for name in crossings:
        groups.setdefault(str(launch.numbers[("arg", name)]), []).append(name)
    if len(groups) > 3:
        raise Unsupported(f"{launch.name}: {len(groups)} different i32 arguments reach 2^31 ({crossings})")
    sides = [{name: side for group, side in zip(groups.values(), choice) for name in group}
             for choice in itertools.product((True, False), repeat=len(groups))]
    result.variants = len(sides)
    for side in sides:
        _prove_variant(world, launch, box, contracts, ctx, side, result)
        if result.status != "proved":
            if side:
                result.notes.append("variant: " + ", ".join(f"{k} {'< 2^31 (i32)' if v else '>= 2^31 (i64)'}"
                                                             for k, v in side.items()))
            break
    return result
