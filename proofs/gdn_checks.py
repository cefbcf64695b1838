"""Checks of the GDN core (``reference/gdn.py``), run on the reference functions themselves.

1. ``closed-form/*``: ``tree_closed_form`` outputs equal ``tree_recurrent`` outputs.
2. ``commit/*``: ``commit(S0, factors, tree, i)`` equals the recurrent state of node i.
3. ``deep/fractions``: both identities on trees deeper than any window a solve might use (past the kernels' 64 and
   128 padded nodes), every solve schedule.
4. ``heads/sympy``: the grouped-value-head convention (value head h reads q/k head ``h // (HV // H)``), written here
   independently of both sides of the identities above, which could share a wrong head map.

Every identity runs with several q/k heads, each read by a group of value heads (``H = 2, HV = 4``), and key / value
dimensions 2, in every engine (sympy, Z3, fractions): a transposed product or a wrong head map is visible there.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from sympy.polys.polyerrors import ExactQuotientFailed

from lumotree.reference.tree import TokenTree

from .core import Context, Outcome, Reference, check
from .exact import (
    Dims,
    InputSpec,
    all_parent_arrays,
    count_parent_arrays,
    first_difference,
    lookup,
    random_fraction_arrays,
    random_parent_array,
    show,
    symbolic_arrays,
    z3_arrays,
    z3_solver,
    z3_value,
)

DOCS_CLOSED_FORM = "closed-form.md"
DOCS_COMMIT = "factor-commit.md"

GVA = Dims(H=2, HV=4, K=2, V=2)  # two q/k heads, each read by two value heads
# (max nodes, dims): every shape up to max nodes with those dims
SYMBOLIC_SCOPE = {
    "quick": ((5, Dims(H=1, HV=2, K=2, V=2)), (4, GVA)),
    "full": ((6, Dims(H=1, HV=1, K=2, V=2)), (6, Dims(H=1, HV=2, K=2, V=2)), (6, GVA)),
}
Z3_SCOPE = {
    "quick": ((4, Dims(H=1, HV=2, K=2, V=2)), (3, GVA)),
    "full": ((6, Dims(H=1, HV=2, K=2, V=2)), (6, GVA)),
}
RANDOM_MAX_NODES = 12
RANDOM_SAMPLES = {"quick": 24, "full": 300}
COUNTEREXAMPLE_TRIES = 64

# (reference, tree, inputs) -> (lhs arrays, rhs arrays) that must agree entry by entry
Sides = Callable[[Reference, TokenTree, dict[str, Any]], tuple[dict[str, Any], dict[str, Any]]]
Premises = Callable[[dict[str, Any]], list[Any]]


def _scope_key(ctx: Context) -> str:
    return "quick" if ctx.quick else "full"


def _gdn_args(x: dict[str, Any]) -> tuple[Any, ...]:
    return x["q"], x["k"], x["v"], x["alpha"], x["beta"], x["S0"]


def _closed_form(ref: Reference, tree: TokenTree, x: dict[str, Any]):
    """``ref.tree_closed_form`` on ``x`` (with ``x["solve"]`` as the solve schedule when given)."""
    extra = {"solve": x["solve"]} if "solve" in x else {}
    return ref.tree_closed_form(*_gdn_args(x), tree, scale=x["scale"], **extra)


def _schedules(ref: Reference) -> tuple[str, ...]:
    return tuple(ref.solve.SCHEDULES) if ref.solve is not None else ("substitution",)


def closed_form_sides(ref: Reference, tree: TokenTree, x: dict[str, Any]):
    """``o`` of the closed form against ``o`` of the recurrence."""
    o_closed, _ = _closed_form(ref, tree, x)
    o_recurrent, _ = ref.tree_recurrent(*_gdn_args(x), tree, scale=x["scale"])
    return {"o": o_closed}, {"o": o_recurrent}


def commit_sides(ref: Reference, tree: TokenTree, x: dict[str, Any]):
    """``commit(S0, factors, tree, i)`` against the recurrent state of node i, every node i."""
    _, factors = _closed_form(ref, tree, x)
    _, states = ref.tree_recurrent(*_gdn_args(x), tree, scale=x["scale"])
    committed = {f"S@{i}": ref.commit(x["S0"], factors, tree, i) for i in range(tree.num_nodes)}
    recurrent = {f"S@{i}": states[i] for i in range(tree.num_nodes)}
    return committed, recurrent


def _symbolic_cases(scope: Iterable[tuple[int, Dims]]) -> list[tuple[tuple[int, ...], Dims]]:
    return [(p, d) for max_nodes, d in scope for n in range(1, max_nodes + 1) for p in all_parent_arrays(n)]


def _scope_text(scope: Iterable[tuple[int, Dims]]) -> dict[str, str]:
    scope = list(scope)
    return {
        "trees": "; ".join(f"all {count_parent_arrays(n)} parent arrays with 1..{n} nodes ({d})" for n, d in scope),
        "dims": "; ".join(str(d) for _, d in scope),
    }


def _fraction_counterexample(
    ref: Reference, parents: tuple[int, ...], dims: Dims, sides: Sides, names: tuple[str, str], seed: int
) -> dict[str, Any] | None:
    """Concrete exact inputs on which ``sides`` differ (the symbolic difference is a nonzero polynomial, so a random
    rational point finds one almost surely)."""
    tree = TokenTree(parents)
    spec = InputSpec.gdn(tree.num_nodes, dims)
    rng = random.Random(seed)
    for _ in range(COUNTEREXAMPLE_TRIES):
        x = random_fraction_arrays(spec, rng)
        lhs, rhs = sides(ref, tree, x)
        entry = first_difference(lhs, rhs, lambda d: d == 0)
        if entry is not None:
            return _counterexample(parents, dims, x, entry, lookup(lhs, entry), lookup(rhs, entry), names)
    return None


def _counterexample(parents, dims, x, entry, lhs_value, rhs_value, names) -> dict[str, Any]:
    return {
        "tree": list(parents),
        "dims": str(dims),
        "inputs": show(x),
        "entry": entry,
        names[0]: show(lhs_value),
        names[1]: show(rhs_value),
    }


def prove_identity_sympy(
    ctx: Context, sides: Sides, names: tuple[str, str], scope_cases, fractions: bool, what: str
) -> Outcome:
    """Run ``sides`` on independent symbols for every shape and dims of ``scope_cases`` (``(max nodes, dims)``
    pairs); equal iff the difference is zero in ``QQ[...]``.

    With ``fractions`` the code may divide: sympy's ``QQ[...]`` divides exactly (a quotient that is not a polynomial
    raises), and such a case is redone in the fraction field ``QQ(...)``, where equality is again canonical.
    """
    cases = _symbolic_cases(scope_cases)
    system = (
        "sympy QQ[...] polynomials with exact division (QQ(...) rational functions where a quotient is not exact)"
        if fractions
        else "sympy QQ[...] polynomials"
    )
    scope = _scope_text(scope_cases) | {
        "numbers": f"{system}: every input entry (q, k, v, alpha, beta, S0, scale) an independent symbol",
    }
    fallbacks = 0
    for parents, dims in ctx.cases(cases, note=what):
        tree = TokenTree(parents)
        spec = InputSpec.gdn(tree.num_nodes, dims)
        x, _ = symbolic_arrays(spec)
        try:
            lhs, rhs = sides(ctx.ref, tree, x)
        except ExactQuotientFailed:
            if not fractions:
                raise
            # a division that is not exact in QQ[...]: redo the case in the fraction field QQ(...)
            fallbacks += 1
            x, _ = symbolic_arrays(spec, fractions=True)
            lhs, rhs = sides(ctx.ref, tree, x)
        entry = first_difference(lhs, rhs, lambda d: d == 0)
        if entry is not None:
            example = _fraction_counterexample(ctx.ref, parents, dims, sides, names, seed=len(cases))
            return Outcome(
                "refuted",
                scope,
                detail=f"{names[0]} - {names[1]} at {entry} is the nonzero {lookup(lhs, entry) - lookup(rhs, entry)}"[
                    :400
                ],
                counterexample=example or {"tree": list(parents), "dims": str(dims), "entry": entry},
            )
    extra = f" ({fallbacks} in QQ(...))" if fallbacks else ""
    return Outcome("proved", scope, detail=f"{len(cases)} (shape, dims) cases: {what} identical{extra}")


def prove_identity_z3(
    ctx: Context, sides: Sides, names: tuple[str, str], scope_cases, premises: Premises | None, what: str
) -> Outcome:
    """Z3 over the reals: the negation ``premises and some entry differs`` is unsat for every shape and dims, each
    query under the resource limit :data:`~lumotree.proofs.exact.Z3_RLIMIT` (deterministic, not wall-clock)."""
    import z3

    cases = _symbolic_cases(scope_cases)
    scope = _scope_text(scope_cases) | {
        "numbers": "Z3 reals, all inputs (q, k, v, alpha, beta, S0, scale) free"
        + ("; premises" if premises else "; no premises")
        + "; one query per output entry, rlimit per query",
    }
    queries = 0
    for parents, dims in ctx.cases(cases, note=what):
        tree = TokenTree(parents)
        spec = InputSpec.gdn(tree.num_nodes, dims)
        # a fresh Z3 context per case: nonlinear real arithmetic is sensitive to term ids and solver state, and a
        # query that is instant in a fresh process can time out after unrelated queries in the same context
        context = z3.Context()
        x, _ = z3_arrays(spec, context)
        lhs, rhs = sides(ctx.ref, tree, x)
        # one query per output entry: "premises and this entry differs" unsat for all entries is the negation of the
        # conjunction unsat, and small queries are far easier for Z3's nonlinear real arithmetic than one big Or. Each
        # query gets a new solver: push/pop would switch Z3 to its incremental core, which lacks the nlsat procedure
        # and can time out where a one-shot solver answers at once
        for name in lhs:
            for idx, a, b in _entries(lhs[name], rhs[name]):
                entry = f"{name}[{', '.join(map(str, idx))}]" if idx else name
                solver = z3_solver(context)
                if premises is not None:
                    solver.add(*premises(x))
                solver.add(a != b)
                verdict = solver.check()
                queries += 1
                if verdict == z3.unknown:
                    return Outcome(
                        "unknown",
                        scope,
                        detail=f"Z3 unknown ({solver.reason_unknown()}) on tree {list(parents)}, {dims}, {entry}",
                    )
                if verdict == z3.sat:
                    model = solver.model()
                    inputs = {
                        key: np.vectorize(lambda t: z3_value(model, t), otypes=[object])(arr)
                        if isinstance(arr, np.ndarray)
                        else z3_value(model, arr)
                        for key, arr in x.items()
                    }
                    return Outcome(
                        "refuted",
                        scope,
                        detail=f"Z3 found inputs where {names[0]} != {names[1]} at {entry}",
                        counterexample=_counterexample(
                            parents, dims, inputs, entry, z3_value(model, a), z3_value(model, b), names
                        ),
                    )
    return Outcome(
        "proved", scope, detail=f"{len(cases)} (shape, dims) cases, {queries} output entries: each negation unsat"
    )


def _entries(a: Any, b: Any):
    a, b = np.asarray(a, dtype=object), np.asarray(b, dtype=object)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    for idx in np.ndindex(*a.shape):
        yield idx, a[idx], b[idx]


def check_identity_fractions(ctx: Context, sides: Sides, names: tuple[str, str], what: str, seed: int) -> Outcome:
    """Exact agreement on random rational inputs and random shapes up to 12 nodes (a sample, hence ``checked``), every
    solve schedule of the closed form in turn, some decays exactly 0."""
    rng = random.Random(seed)
    samples = RANDOM_SAMPLES[_scope_key(ctx)]
    schedules = _schedules(ctx.ref)
    scope = {
        "trees": f"{samples} random shapes (chain / star / uniform parents) with 1..{RANDOM_MAX_NODES} nodes",
        "dims": "H in {1, 2}, HV in {H, 2H}, K, V in {1, 2, 3}",
        "numbers": "fractions.Fraction, random small rationals, alpha in [0, 1] (a tenth exactly 0), beta in [0, 2]; "
        f"closed-form solve schedules {', '.join(schedules)} in turn",
    }
    for sample in ctx.cases(range(samples), note=what):
        parents = random_parent_array(rng.randint(1, RANDOM_MAX_NODES), rng)
        H = rng.choice((1, 2))
        dims = Dims(H=H, HV=H * rng.choice((1, 2)), K=rng.randint(1, 3), V=rng.randint(1, 3))
        tree = TokenTree(parents)
        x = random_fraction_arrays(InputSpec.gdn(tree.num_nodes, dims), rng)
        x["alpha"] = np.array([0 * a if rng.random() < 0.1 else a for a in x["alpha"].flat], dtype=object).reshape(
            x["alpha"].shape)
        x["solve"] = schedules[sample % len(schedules)]
        lhs, rhs = sides(ctx.ref, tree, x)
        entry = first_difference(lhs, rhs, lambda d: d == 0)
        if entry is not None:
            return Outcome(
                "refuted",
                scope,
                detail=f"{names[0]} != {names[1]} at {entry}",
                counterexample=_counterexample(parents, dims, x, entry, lookup(lhs, entry), lookup(rhs, entry), names),
            )
    return Outcome("checked", scope, detail=f"{samples} random (shape, dims, inputs) samples agree exactly")


# ---------------------------------------------------------------------------------------------------- 1. closed form
CLOSED_FORM_NAMES = ("tree_closed_form", "tree_recurrent")


@check(
    "closed-form/sympy",
    claim="tree_closed_form outputs = tree_recurrent outputs, as polynomials in all inputs",
    docs=DOCS_CLOSED_FORM,
    weight=8,
)
def closed_form_sympy(ctx: Context) -> Outcome:
    return prove_identity_sympy(
        ctx,
        closed_form_sides,
        CLOSED_FORM_NAMES,
        SYMBOLIC_SCOPE[_scope_key(ctx)],
        fractions=False,
        what="outputs",
    )


@check(
    "closed-form/z3",
    claim="tree_closed_form outputs = tree_recurrent outputs for all real inputs (Z3: negation unsat)",
    docs=DOCS_CLOSED_FORM,
    weight=6,
)
def closed_form_z3(ctx: Context) -> Outcome:
    return prove_identity_z3(
        ctx, closed_form_sides, CLOSED_FORM_NAMES, Z3_SCOPE[_scope_key(ctx)], None, "outputs"
    )


@check(
    "closed-form/fractions",
    claim="tree_closed_form outputs = tree_recurrent outputs on random exact inputs, shapes up to 12 nodes",
    expected="checked",
    docs=DOCS_CLOSED_FORM,
)
def closed_form_fractions(ctx: Context) -> Outcome:
    return check_identity_fractions(ctx, closed_form_sides, CLOSED_FORM_NAMES, "outputs", seed=1)


# ---------------------------------------------------------------------------------------------------- 2. commit
COMMIT_NAMES = ("commit", "tree_recurrent")


@check(
    "commit/sympy",
    claim="commit(S0, factors, tree, i) = recurrent state of node i, every node, as polynomials in all inputs",
    docs=DOCS_COMMIT,
    weight=8,
)
def commit_sympy(ctx: Context) -> Outcome:
    return prove_identity_sympy(
        ctx,
        commit_sides,
        COMMIT_NAMES,
        SYMBOLIC_SCOPE[_scope_key(ctx)],
        fractions=True,
        what="states",
    )


@check(
    "commit/z3",
    claim="commit(S0, factors, tree, i) = recurrent state of node i for all real inputs (Z3: negation unsat)",
    docs=DOCS_COMMIT,
    weight=10,
)
def commit_z3(ctx: Context) -> Outcome:
    return prove_identity_z3(
        ctx, commit_sides, COMMIT_NAMES, Z3_SCOPE[_scope_key(ctx)], None, "states"
    )


@check(
    "commit/fractions",
    claim="commit(S0, factors, tree, i) = recurrent state of node i on random exact inputs, shapes up to 12 nodes",
    expected="checked",
    docs=DOCS_COMMIT,
)
def commit_fractions(ctx: Context) -> Outcome:
    return check_identity_fractions(ctx, commit_sides, COMMIT_NAMES, "states", seed=2)




# ---------------------------------------------------------------------------------------------------- 3. deep trees
def deep_parent_array(kind: str, num_nodes: int, rng: random.Random) -> tuple[int, ...]:
    """A deep tree: ``chain``; ``deep-wide`` (a spine of half the nodes, the rest hanging off random spine nodes);
    ``broom`` (a chain of all but 4 nodes, its last node with 4 leaf children)."""
    if kind == "chain":
        return (-1, *range(num_nodes - 1))
    if kind == "deep-wide":
        spine = max(1, num_nodes // 2)
        return (-1, *range(spine - 1), *(rng.randrange(spine) for _ in range(num_nodes - spine)))
    if kind == "broom":
        handle = max(1, num_nodes - 4)
        return (-1, *range(handle - 1), *([handle - 1] * (num_nodes - handle)))
    raise ValueError(f"kind = {kind!r} is not one of chain, deep-wide, broom")


DEEP_TREES = {
    "quick": (("chain", 70), ("broom", 40)),
    "full": (("chain", 130), ("deep-wide", 130), ("broom", 70), ("chain", 33), ("chain", 65)),
}


@check(
    "deep/fractions",
    claim="tree_closed_form outputs = tree_recurrent outputs and commit = the recurrent state of every node on trees "
    "deeper than any window (depths past 64 and 128)",
    expected="checked",
    docs=DOCS_CLOSED_FORM,
    weight=2,
)
def deep_trees(ctx: Context) -> Outcome:
    shapes = DEEP_TREES[_scope_key(ctx)]
    rng = random.Random(7)
    scope = {
        "trees": "; ".join(f"{kind} of {n} nodes" for kind, n in shapes) + " (depth up to "
        f"{max(TokenTree(deep_parent_array(k, n, random.Random(0))).max_depth for k, n in shapes)})",
        "dims": str(GVA),
        "numbers": "fractions.Fraction, random small rationals (one sample per tree), alpha in (0, 1], beta in [0, 2]",
    }
    for kind, n in ctx.cases(shapes, note="deep trees"):
        parents = deep_parent_array(kind, n, rng)
        tree = TokenTree(parents)
        x = random_fraction_arrays(InputSpec.gdn(n, GVA), rng)
        for names, sides in ((CLOSED_FORM_NAMES, closed_form_sides), (COMMIT_NAMES, commit_sides)):
            lhs, rhs = sides(ctx.ref, tree, x)
            entry = first_difference(lhs, rhs, lambda d: d == 0)
            if entry is not None:
                example = _counterexample(parents, GVA, x, entry, lookup(lhs, entry), lookup(rhs, entry), names)
                return Outcome("refuted", scope, detail=f"{names[0]} != {names[1]} at {entry} on a {kind} of {n} "
                               "nodes", counterexample=example | {"inputs": "(omitted: deep tree)"})
    return Outcome("checked", scope, detail=f"{len(shapes)} deep trees: outputs and every node's commit agree exactly")


# ---------------------------------------------------------------------------------------------------- 4. head map
HEADS_SCOPE = {"quick": ((3, GVA),), "full": ((5, GVA), (4, Dims(H=3, HV=6, K=2, V=2)), (4, Dims(H=2, HV=2, K=2, V=2)))}


def _one_head(x: dict[str, Any], h: int, group: int) -> dict[str, Any]:
    """Value head ``h``'s single-head problem: q/k head ``h // group`` (the convention), value head h's v, alpha,
    beta and S0."""
    g = h // group
    return {
        "q": x["q"][:, g : g + 1],
        "k": x["k"][:, g : g + 1],
        "v": x["v"][:, h : h + 1],
        "alpha": x["alpha"][:, h : h + 1],
        "beta": x["beta"][:, h : h + 1],
        "S0": x["S0"][h : h + 1],
        "scale": x["scale"],
    }


def heads_sides(ref: Reference, tree: TokenTree, x: dict[str, Any]):
    """Every GDN function on the multi-head problem (sliced per value head) against the same function on each value
    head's single-head problem: outputs, states, factors, commits, and ``chain`` on a chain."""
    H, HV = x["q"].shape[1], x["v"].shape[1]
    group = HV // H
    o_rec, states = ref.tree_recurrent(*_gdn_args(x), tree, scale=x["scale"])
    o_cf, factors = _closed_form(ref, tree, x)
    multi: dict[str, Any] = {}
    single: dict[str, Any] = {}
    for h in range(HV):
        xh = _one_head(x, h, group)
        o_rec_h, states_h = ref.tree_recurrent(*_gdn_args(xh), tree, scale=xh["scale"])
        o_cf_h, factors_h = _closed_form(ref, tree, xh)
        pairs = {
            "tree_recurrent o": (o_rec[:, h], o_rec_h[:, 0]),
            "tree_recurrent states": (states[:, h], states_h[:, 0]),
            "tree_closed_form o": (o_cf[:, h], o_cf_h[:, 0]),
            "factors.delta": (factors.delta[:, h], factors_h.delta[:, 0]),
            "factors.gamma": (factors.gamma[:, h], factors_h.gamma[:, 0]),
        }
        for i in range(tree.num_nodes):
            pairs[f"commit@{i}"] = (ref.commit(x["S0"], factors, tree, i)[h], ref.commit(xh["S0"], factors_h, tree,
                                                                                          i)[0])
        if tree.parents == tuple(range(-1, tree.num_nodes - 1)):
            o_chain, S_last = ref.chain(*_gdn_args(x), scale=x["scale"])
            o_chain_h, S_last_h = ref.chain(*_gdn_args(xh), scale=xh["scale"])
            pairs |= {"chain o": (o_chain[:, h], o_chain_h[:, 0]), "chain S_last": (S_last[h], S_last_h[0])}
        for name, (a, b) in pairs.items():
            multi[f"{name} (value head {h})"], single[f"{name} (value head {h})"] = a, b
    multi["factors.k"], single["factors.k"] = factors.k, x["k"]
    return multi, single


@check(
    "heads/sympy",
    claim="value head h of every GDN function (chain, tree_recurrent, tree_closed_form, its factors, commit) equals "
    "the same function on head h alone with q/k head h // (HV // H): the GVA convention, stated independently of "
    "both sides of the identities",
    docs="conventions.md",
    weight=4,
)
def heads_convention(ctx: Context) -> Outcome:
    return prove_identity_sympy(
        ctx, heads_sides, ("multi-head", "single head"), HEADS_SCOPE[_scope_key(ctx)], fractions=True,
        what="heads",
    )
