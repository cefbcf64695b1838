"""``lossless/symbolic``: lossless verification at a node for every target and draft distribution, not samples.

The reference's step (``verify.step_distribution``: ``draw_tree`` then ``verify_sampling`` under the exact coin
enumerator) runs on a node with k draws (a star template) whose target and draft distributions are symbols:
``target(c) = (p_0, ..., p_V-2, 1 - sum)`` and ``draft(c)`` likewise, every entry ``>= 0`` (zeros included): the whole
space of distributions at the node where the draws are verified (the rows below it, read only for the token after an
accepted draw, are fixed exact distributions). Arithmetic on them is exact, in sympy's field ``QQ(p, q)``.

The code also *compares* probabilities (``min(1, R/Q)``, ``max(0, R - Q)``, zero tests, the top-k order), and a
comparison of two rational functions has no single answer. So the run is split into cases: an oracle answers each
comparison with an answer consistent with its answers so far (Z3, nonlinear real arithmetic, under a deterministic
resource limit), branching where both are, and the step is replayed for every consistent set of answers, depth
first, as the coin enumerator replays coins. Each run covers one region of the distribution space; together they
cover all of it.

In each region the step's emitted distribution is a rational function of the symbols, and the per-step condition of
``lossless/<variant>`` must hold: for every prefix y of the step's emitted tokens and every token t,
``P(emit y + (t,)) = P(emit y and more) * target(context + y)[t]``. It is checked as an identity of rational
functions, or, where it needs the region's equalities (``p = q`` on a boundary), by Z3 (its negation unsat under the
region's constraints). A region where it fails is a counterexample: Z3's model gives the distributions. The
proposition this proves, every token emitted at a node distributed as the node's target, is the step of the proof in
``docs/lossless-verification.md``; deeper templates compose it (``lossless/<variant>`` checks them on samples).
"""

from __future__ import annotations

import itertools
from fractions import Fraction
from typing import Any

import z3

from .core import Context, Outcome, check
from .exact import z3_solver, z3_value

DOCS = "lossless-verification.md"
ROOT_CONTEXT = (0,)
# (vocabulary, most draws k): the stars [-1, 0, ..., 0] with 1..k draws at the root
SCOPE = {"quick": ((2, 2),), "full": ((2, 4), (3, 2))}
VARIANT_ORDER = ("iid", "without_replacement", "deterministic")
MAX_REGIONS = 20_000


class Undecided(Exception):
    """Z3 could not decide a comparison within its resource limit."""


class Oracle:
    """Truth values of comparisons of rational functions of the distribution symbols, by case split.

    ``prefix`` is the list of answers to replay at the branch points (comparisons whose both answers are consistent
    with the region so far); past it the first consistent answer is taken. ``choices`` / ``counts`` record the branch
    points of this run, as the coin enumerator records its coins.
    """

    def __init__(self, field_: Any, variables: list[Any], base: list[Any], prefix: list[int], shared: dict):
        self.field = field_
        self.variables = variables  # the Z3 real of each generator, in the field's order
        self.assumptions = list(base)
        self.prefix = prefix
        self.choices: list[int] = []
        self.counts: list[int] = []
        self.decisions: dict[tuple[Any, str], bool] = {}
        # shared by the runs of one case: Z3 terms, and the consistent answers of a comparison after a given sequence
        # of choices (the region so far is a function of that sequence, and replays repeat it)
        self.z3_terms: dict[Any, Any] = shared.setdefault("terms", {})
        self.answers: dict[tuple, list[bool]] = shared.setdefault("answers", {})

    def z3_term(self, polynomial: Any) -> Any:
        if polynomial not in self.z3_terms:
            ctx = self.variables[0].ctx
            terms = []
            for monomial, coefficient in polynomial.terms():
                term = z3.RealVal(f"{coefficient.numerator}/{coefficient.denominator}", ctx)
                for variable, power in zip(self.variables, monomial):
                    for _ in range(power):
                        term = term * variable
                terms.append(term)
            self.z3_terms[polynomial] = z3.Sum(*terms) if terms else z3.RealVal(0, ctx)
        return self.z3_terms[polynomial]

    def relation(self, value: Any, op: str) -> Any:
        """The Z3 constraint ``value op 0`` for a rational function ``value`` (``op`` in <, <=, >, >=, ==, !=), with
        its denominator nonzero."""
        if (value, op) not in self.z3_terms:
            self.z3_terms[(value, op)] = self._relation(value, op)
        return self.z3_terms[(value, op)]

    def _relation(self, value: Any, op: str) -> Any:
        numerator, denominator = self.z3_term(value.numer), self.z3_term(value.denom)
        product = numerator * denominator  # the sign of value where the denominator is nonzero
        relations = {
            "<": product < 0, "<=": product <= 0, ">": product > 0, ">=": product >= 0,
            "==": numerator == 0, "!=": numerator != 0,
        }
        return z3.And(denominator != 0, relations[op])

    def satisfiable(self, constraint: Any) -> bool:
        solver = z3_solver(constraint.ctx)
        solver.add(*self.assumptions, constraint)
        verdict = solver.check()
        if verdict == z3.unknown:
            raise Undecided(solver.reason_unknown())
        return verdict == z3.sat

    def decide(self, value: Any, op: str) -> bool:
        """Whether ``value op 0`` in the current region; when both answers are consistent with the region, a branch
        point (replayed from the prefix, else True first) whose answer becomes a constraint of the region."""
        if value.numer.is_ground and value.denom.is_ground:
            number = value.numer.LC / value.denom.LC
            return {"<": number < 0, "<=": number <= 0, ">": number > 0, ">=": number >= 0, "==": number == 0,
                    "!=": number != 0}[op]
        key = (value, op)
        if key not in self.decisions:
            region = (tuple(self.choices), value, op)
            if region not in self.answers:
                self.answers[region] = [answer for answer in (True, False)
                                        if self.satisfiable(self.relation(value, op if answer else NEGATION[op]))]
            options = self.answers[region]
            if not options:
                raise Undecided("neither answer is consistent (the region is empty)")
            if len(options) == 2:
                k = len(self.choices)
                choice = self.prefix[k] if k < len(self.prefix) else 0
                self.choices.append(choice)
                self.counts.append(2)
                answer = options[choice]
                self.assumptions.append(self.relation(value, op if answer else NEGATION[op]))
            else:
                answer = options[0]
            self.decisions[key] = answer
        return self.decisions[key]


NEGATION = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}


class Prob:
    """A probability: an element of ``QQ(symbols)``; comparisons ask the :class:`Oracle`."""

    __slots__ = ("value", "oracle")

    def __init__(self, value: Any, oracle: Oracle):
        self.value = value
        self.oracle = oracle

    def _other(self, other: Any) -> Any:
        if isinstance(other, Prob):
            return other.value
        if isinstance(other, (int, Fraction)) and not isinstance(other, bool):
            return self.oracle.field(other)
        return NotImplemented

    def _wrap(self, value: Any) -> Prob:
        return Prob(value, self.oracle)

    def __add__(self, other):
        o = self._other(other)
        return NotImplemented if o is NotImplemented else self._wrap(self.value + o)

    __radd__ = __add__

    def __sub__(self, other):
        o = self._other(other)
        return NotImplemented if o is NotImplemented else self._wrap(self.value - o)

    def __rsub__(self, other):
        o = self._other(other)
        return NotImplemented if o is NotImplemented else self._wrap(o - self.value)

    def __mul__(self, other):
        o = self._other(other)
        return NotImplemented if o is NotImplemented else self._wrap(self.value * o)

    __rmul__ = __mul__

    def __truediv__(self, other):
        o = self._other(other)
        return NotImplemented if o is NotImplemented else self._wrap(self.value / o)

    def __rtruediv__(self, other):
        o = self._other(other)
        return NotImplemented if o is NotImplemented else self._wrap(o / self.value)

    def __neg__(self):
        return self._wrap(-self.value)

    def _decide(self, other: Any, op: str) -> bool:
        o = self._other(other)
        if o is NotImplemented:
            raise TypeError(f"cannot compare a symbolic probability with {type(other).__name__}")
        return self.oracle.decide(self.value - o, op)

    def __lt__(self, other):
        return self._decide(other, "<")

    def __le__(self, other):
        return self._decide(other, "<=")

    def __gt__(self, other):
        return self._decide(other, ">")

    def __ge__(self, other):
        return self._decide(other, ">=")

    def __eq__(self, other):
        if isinstance(other, Prob) and other.oracle is not self.oracle:
            return False
        return self._decide(other, "==")

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        return hash((id(self.oracle), self.value))

    def __float__(self):
        raise TypeError("a symbolic probability has no float value")

    def __repr__(self):
        return f"Prob({self.value})"


def _symbolic_distributions(vocab: int):
    """The field, its Z3 variables, and for the target (``"p"``) and draft (``"q"``) rows at the node: the simplex
    constraints of their free entries and the row ``[entries]``."""
    from sympy import QQ
    from sympy.polys.fields import field

    names = [f"{kind}_{t}" for kind in ("p", "q") for t in range(vocab - 1)]
    field_, *gens = field(names, QQ)
    z3_context = z3.Context()
    variables = [z3.Real(n, z3_context) for n in names]
    entries: dict[str, list[Any]] = {}
    simplex: dict[str, list[Any]] = {}
    for k, kind in enumerate(("p", "q")):
        lo, hi = k * (vocab - 1), (k + 1) * (vocab - 1)
        free, free_z3 = gens[lo:hi], variables[lo:hi]
        entries[kind] = [*free, 1 - sum(free, field_(0))]
        simplex[kind] = [v >= 0 for v in free_z3] + [z3.Sum(*free_z3) <= 1]
    return field_, variables, simplex, entries


def _fixed(vocab: int, salt: int) -> list[Fraction]:
    """A fixed exact distribution for the rows below the node (positive, varying with the context length)."""
    weights = [1 + (t + salt) % 3 for t in range(vocab)]
    return [Fraction(w, sum(weights)) for w in weights]


def _step_condition_failures(step: dict, target: Any, context: tuple[int, ...]):
    """``(prefix, lhs, rhs)`` of the per-step condition, for every prefix and token (see the module docstring)."""
    reach: dict[tuple[int, ...], Any] = {}
    more: dict[tuple[int, ...], Any] = {}
    for emitted, p in step.items():
        for t in range(len(emitted) + 1):
            reach[emitted[:t]] = reach.get(emitted[:t], 0) + p
            if t < len(emitted):
                more[emitted[:t]] = more.get(emitted[:t], 0) + p
    for prefix in sorted(set(more) | {y[:-1] for y in reach if y}, key=lambda y: (len(y), y)):
        row = target(context + prefix)
        for t in range(len(row)):
            yield prefix + (t,), reach.get(prefix + (t,), 0), more.get(prefix, 0) * row[t]


def _value(x: Any, oracle: Oracle) -> Any:
    return x.value if isinstance(x, Prob) else oracle.field(x)


def prove_template(
    verify: Any, parents: tuple[int, ...], vocab: int, variant: str, verifier: str = "verify_sampling"
) -> tuple[str, int, Any]:
    """Every region of one (template, vocab, variant): ``("proved", regions, None)``, ``("refuted", regions,
    counterexample)`` or ``("unknown", regions, reason)``."""
    field_, variables, simplex, entries = _symbolic_distributions(vocab)
    prefix: list[int] = []
    regions = 0
    shared: dict = {}
    while True:
        oracle = Oracle(field_, variables, [], prefix, shared)
        rows = {kind: [Prob(v, oracle) for v in row] for kind, row in entries.items()}
        read: set = set()

        def row(kind, c, salt, rows=rows, read=read, oracle=oracle):
            if tuple(c) != ROOT_CONTEXT:
                return _fixed(vocab, salt)
            if kind not in read:  # a row's simplex constraints join the region when the step first reads it
                read.add(kind)
                oracle.assumptions.extend(simplex[kind])
            return rows[kind]

        def target(c, row=row):
            return row("p", c, len(c))

        def draft(c, row=row):
            return row("q", c, len(c) + 1)

        regions += 1
        try:
            step = verify.step_distribution(ROOT_CONTEXT, target, draft, list(parents), variant,
                                            getattr(verify, verifier))
            failure = None
            for emitted, lhs, rhs in _step_condition_failures(step, target, ROOT_CONTEXT):
                difference = _value(lhs, oracle) - _value(rhs, oracle)
                if difference != 0 and oracle.satisfiable(oracle.relation(difference, "!=")):
                    failure = (emitted, lhs, rhs, difference)
                    break
        except Undecided as err:
            return "unknown", regions, f"Z3 undecided ({err})"
        except (ArithmeticError, ValueError, TypeError) as err:  # the step must be defined on every distribution
            failure = ("(raised)", repr(err), None, None)
        if failure is not None:
            return "refuted", regions, _counterexample(oracle, failure, {k: entries[k] for k in read}, parents, vocab,
                                                       variant)
        level = len(oracle.choices) - 1
        while level >= 0 and oracle.choices[level] + 1 >= oracle.counts[level]:
            level -= 1
        if level < 0:
            return "proved", regions, None
        if regions >= MAX_REGIONS:
            return "unknown", regions, f"more than {MAX_REGIONS} regions"
        prefix = oracle.choices[:level] + [oracle.choices[level] + 1]


def _counterexample(oracle: Oracle, failure, entries, parents, vocab, variant) -> dict[str, Any]:
    emitted, lhs, rhs, difference = failure
    example: dict[str, Any] = {"template": list(parents), "vocab": vocab, "variant": variant,
                               "emitted": list(emitted) if isinstance(emitted, tuple) else emitted}
    solver = z3_solver(oracle.variables[0].ctx)
    solver.add(*oracle.assumptions)
    if difference is not None:
        solver.add(oracle.relation(difference, "!="))
        example |= {"step_probability": str(_value(lhs, oracle)), "expected": str(_value(rhs, oracle))}
    else:
        example["error"] = lhs
    if solver.check() == z3.sat:
        model = solver.model()
        gens = oracle.field.gens
        point = {g: z3_value(model, v) for g, v in zip(gens, oracle.variables)}
        example["distributions at the node"] = {
            f"{'target' if kind == 'p' else 'draft'}{list(ROOT_CONTEXT)}": [str(_evaluate(v, gens, point)) for v in row]
            for kind, row in entries.items()
        }
    return example


def _evaluate(value: Any, gens: Any, point: dict) -> Any:
    from sympy import Rational

    expr = value.as_expr()
    return expr.subs({g.as_expr(): Rational(str(point[g])) for g in gens if not isinstance(point[g], str)})


@check(
    "lossless/symbolic",
    claim="verification at a node with k draws emits every token distributed as the target given the tokens before "
    "it, for every target and draft distribution at the node (symbolic, case split on every comparison), every "
    "variant",
    docs=DOCS,
    weight=9,
)
def lossless_symbolic(ctx: Context) -> Outcome:
    verify = ctx.ref.need("verify")
    scope_cases = SCOPE["quick" if ctx.quick else "full"]
    cases = [((-1, *([0] * k)), vocab, variant) for vocab, draws in scope_cases for k in range(draws + 1)
             for variant in VARIANT_ORDER]
    scope = {
        "trees": "; ".join(f"a node with 0..{k} draws (stars of 1..{k + 1} nodes) for vocab {v}"
                           for v, k in scope_cases),
        "dims": f"variants {', '.join(VARIANT_ORDER)}; one step from context {ROOT_CONTEXT}, every emitted position",
        "numbers": "sympy QQ(p, q): the node's target and draft each a free point of the simplex (zeros included); "
        "every comparison split into its consistent answers by Z3 (nonlinear real arithmetic, rlimit per query)",
        "distributions": "all of them at the node; the rows below it fixed",
    }
    total = 0
    for parents, vocab, variant in ctx.cases(cases, note="templates x vocab x variant"):
        status, regions, info = prove_template(verify, parents, vocab, variant)
        total += regions
        if status == "refuted":
            return Outcome("refuted", scope, detail=f"{variant}, template {list(parents)}, vocab {vocab}: emits "
                           f"{info['emitted']} with the wrong probability in a region of the distributions",
                           counterexample=info)
        if status == "unknown":
            return Outcome("unknown", scope, detail=f"{variant}, template {list(parents)}, vocab {vocab}: {info}")
    return Outcome("proved", scope, detail=f"{len(cases)} (template, vocab, variant) cases, {total} regions: every "
                   "region satisfies the per-step condition")
