"""Checks of the GDN core (``reference/gdn.py``), run on the reference functions themselves.

1. ``closed-form/*``: ``tree_closed_form`` outputs equal ``tree_recurrent`` outputs.
2. ``commit/*``: ``commit(S0, factors, tree, i)`` equals the recurrent state of node i.
3. ``chunk/sympy``: on a chain, the closed form equals flash-linear-attention's chunkwise (UT transform) form,
   written out independently below, for every chunk size.
4. ``nilpotent/sympy``: ``(I + A)^{-1} = sum_{m <= depth} (-A)^m = prod_{k < bitlen(depth)} (I + (-A)^(2^k))`` for any
   A supported on the strict ancestor mask, and its inverse by blocks at every split point (the kernels' halves).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from fractions import Fraction
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
    z3_value,
)

DOCS_CLOSED_FORM = "closed-form.md"
DOCS_COMMIT = "factor-commit.md"

# Symbolic scope (the issue's): every shape up to 5 nodes, K = V = 2, HV = H and HV = 2H. The full scope adds H = 2,
# HV = 4, where the GVA head mapping h // (HV // H) is exercised (with H = 1 every value head reads q/k head 0).
SYMBOLIC_DIMS = {
    "quick": (Dims(H=1, HV=1, K=2, V=2), Dims(H=1, HV=2, K=2, V=2)),
    "full": (Dims(H=1, HV=1, K=2, V=2), Dims(H=1, HV=2, K=2, V=2), Dims(H=2, HV=4, K=2, V=2)),
}
SYMBOLIC_MAX_NODES = {"quick": 5, "full": 6}
Z3_DIMS = (Dims(H=1, HV=1, K=1, V=1), Dims(H=1, HV=2, K=1, V=1))
Z3_MAX_NODES = {"quick": 4, "full": 6}
Z3_TIMEOUT_MS = 300_000
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


def closed_form_sides(ref: Reference, tree: TokenTree, x: dict[str, Any]):
    """``o`` of the closed form against ``o`` of the recurrence."""
    o_closed, _ = ref.tree_closed_form(*_gdn_args(x), tree, scale=x["scale"])
    o_recurrent, _ = ref.tree_recurrent(*_gdn_args(x), tree, scale=x["scale"])
    return {"o": o_closed}, {"o": o_recurrent}


def commit_sides(ref: Reference, tree: TokenTree, x: dict[str, Any]):
    """``commit(S0, factors, tree, i)`` against the recurrent state of node i, every node i."""
    _, factors = ref.tree_closed_form(*_gdn_args(x), tree, scale=x["scale"])
    _, states = ref.tree_recurrent(*_gdn_args(x), tree, scale=x["scale"])
    committed = {f"S@{i}": ref.commit(x["S0"], factors, tree, i) for i in range(tree.num_nodes)}
    recurrent = {f"S@{i}": states[i] for i in range(tree.num_nodes)}
    return committed, recurrent


def alpha_positive(x: dict[str, Any]) -> list[Any]:
    """The commit divides by path products of alpha: alpha > 0 (the GPU's alpha = exp(g) always is)."""
    return [a > 0 for a in x["alpha"].flat]


def _symbolic_cases(max_nodes: int, dims_list: Iterable[Dims]) -> list[tuple[tuple[int, ...], Dims]]:
    return [(p, d) for n in range(1, max_nodes + 1) for p in all_parent_arrays(n) for d in dims_list]


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
    ctx: Context, sides: Sides, names: tuple[str, str], max_nodes: int, dims_list, fractions: bool, what: str
) -> Outcome:
    """Run ``sides`` on independent symbols for every shape and dims; equal iff the difference is zero in ``QQ[...]``.

    With ``fractions`` the code may divide: sympy's ``QQ[...]`` divides exactly (a quotient that is not a polynomial
    raises), and such a case is redone in the fraction field ``QQ(...)``, where equality is again canonical.
    """
    cases = _symbolic_cases(max_nodes, dims_list)
    system = (
        "sympy QQ[...] polynomials with exact division (QQ(...) rational functions where a quotient is not exact)"
        if fractions
        else "sympy QQ[...] polynomials"
    )
    scope = {
        "trees": f"all {count_parent_arrays(max_nodes)} parent arrays with 1..{max_nodes} nodes",
        "dims": "; ".join(map(str, dims_list)),
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
    ctx: Context, sides: Sides, names: tuple[str, str], max_nodes: int, dims_list, premises: Premises | None, what: str
) -> Outcome:
    """Z3 over the reals: the negation ``premises and some entry differs`` is unsat for every shape and dims."""
    import z3

    cases = _symbolic_cases(max_nodes, dims_list)
    scope = {
        "trees": f"all {count_parent_arrays(max_nodes)} parent arrays with 1..{max_nodes} nodes",
        "dims": "; ".join(map(str, dims_list)),
        "numbers": "Z3 reals, all inputs (q, k, v, alpha, beta, S0, scale) free"
        + ("; premise alpha > 0" if premises else "; no premises"),
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
                solver = z3.Solver(ctx=context)
                solver.set("timeout", Z3_TIMEOUT_MS)
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
    """Exact agreement on random rational inputs and random shapes up to 12 nodes (a sample, hence ``checked``)."""
    rng = random.Random(seed)
    samples = RANDOM_SAMPLES[_scope_key(ctx)]
    scope = {
        "trees": f"{samples} random shapes (chain / star / uniform parents) with 1..{RANDOM_MAX_NODES} nodes",
        "dims": "H in {1, 2}, HV in {H, 2H}, K, V in {1, 2, 3}",
        "numbers": "fractions.Fraction, random small rationals, alpha in (0, 1], beta in [0, 2]",
    }
    for _ in ctx.cases(range(samples), note=what):
        parents = random_parent_array(rng.randint(1, RANDOM_MAX_NODES), rng)
        H = rng.choice((1, 2))
        dims = Dims(H=H, HV=H * rng.choice((1, 2)), K=rng.randint(1, 3), V=rng.randint(1, 3))
        tree = TokenTree(parents)
        x = random_fraction_arrays(InputSpec.gdn(tree.num_nodes, dims), rng)
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
)
def closed_form_sympy(ctx: Context) -> Outcome:
    return prove_identity_sympy(
        ctx,
        closed_form_sides,
        CLOSED_FORM_NAMES,
        SYMBOLIC_MAX_NODES[_scope_key(ctx)],
        SYMBOLIC_DIMS[_scope_key(ctx)],
        fractions=False,
        what="outputs",
    )


@check(
    "closed-form/z3",
    claim="tree_closed_form outputs = tree_recurrent outputs for all real inputs (Z3: negation unsat)",
    docs=DOCS_CLOSED_FORM,
)
def closed_form_z3(ctx: Context) -> Outcome:
    return prove_identity_z3(
        ctx, closed_form_sides, CLOSED_FORM_NAMES, Z3_MAX_NODES[_scope_key(ctx)], Z3_DIMS, None, "outputs"
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
    claim="commit(S0, factors, tree, i) = recurrent state of node i, every node, as rational functions",
    docs=DOCS_COMMIT,
)
def commit_sympy(ctx: Context) -> Outcome:
    return prove_identity_sympy(
        ctx,
        commit_sides,
        COMMIT_NAMES,
        SYMBOLIC_MAX_NODES[_scope_key(ctx)],
        SYMBOLIC_DIMS[_scope_key(ctx)],
        fractions=True,
        what="states",
    )


@check(
    "commit/z3",
    claim="commit(S0, factors, tree, i) = recurrent state of node i for all real inputs with alpha > 0 (Z3)",
    docs=DOCS_COMMIT,
)
def commit_z3(ctx: Context) -> Outcome:
    return prove_identity_z3(
        ctx, commit_sides, COMMIT_NAMES, Z3_MAX_NODES[_scope_key(ctx)], Z3_DIMS, alpha_positive, "states"
    )


@check(
    "commit/fractions",
    claim="commit(S0, factors, tree, i) = recurrent state of node i on random exact inputs, shapes up to 12 nodes",
    expected="checked",
    docs=DOCS_COMMIT,
)
def commit_fractions(ctx: Context) -> Outcome:
    return check_identity_fractions(ctx, commit_sides, COMMIT_NAMES, "states", seed=2)


# ---------------------------------------------------------------------------------------------------- 3. chain = chunk
def chunked_gated_delta_rule(q, k, v, alpha, beta, S0, scale, chunk_size: int):
    """flash-linear-attention's chunkwise gated delta rule (WY / UT transform), one sequence, exact arithmetic.

    Per chunk of L tokens and value head, with in-chunk decay ``g_t = prod_{s <= t} alpha_s`` and
    ``decay[t, s] = prod_{s < r <= t} alpha_r`` (fla's ``exp(g_t - g_s)``, causal)::

        T     = (I + tril(diag(beta) K K^T ⊙ decay, -1))^{-1}       (fla: solve_tril)
        W     = T diag(beta g) K,   U = T diag(beta) V             (fla: recompute_w_u)
        Vnew  = U - W S                                            (fla: chunk_gated_delta_rule_fwd_h)
        O     = scale (diag(g) Q S + (Q K^T ⊙ decay) Vnew)         (fla: chunk_fwd_o)
        S    <- g_L S + (K ⊙ decay[L-1, :])^T Vnew

    Returns ``(o [N, HV, V], v_new [N, HV, V], S_last [HV, K, V])``.
    """
    N, H, K = q.shape
    HV, V = v.shape[1:]
    group = HV // H
    o = np.zeros((N, HV, V), dtype=object)
    v_new = np.zeros((N, HV, V), dtype=object)
    S = S0.copy()  # [HV, K, V]
    for start in range(0, N, chunk_size):
        stop = min(start + chunk_size, N)
        L = stop - start
        for h in range(HV):
            Qc, Kc = q[start:stop, h // group], k[start:stop, h // group]  # [L, K]
            Vc = v[start:stop, h]  # [L, V]
            a, b = alpha[start:stop, h], beta[start:stop, h]  # [L]
            decay = np.zeros((L, L), dtype=object)  # [L, L] causal, inclusive
            for t in range(L):
                decay[t, t] = 1
                for s in range(t - 1, -1, -1):
                    decay[t, s] = decay[t, s + 1] * a[s + 1]
            g = np.array([decay[t, 0] * a[0] for t in range(L)], dtype=object)  # [L]
            strict = np.tril(np.ones((L, L), dtype=bool), -1)
            A = np.where(strict, (Kc @ Kc.T) * decay, 0) * b[:, None]  # [L, L]
            T = np.zeros((L, L), dtype=object)  # [L, L] = (I + A)^{-1} by forward substitution
            for t in range(L):
                row = np.zeros(L, dtype=object)
                row[t] = 1
                for s in range(t):
                    row = row - T[s] * A[t, s]
                T[t] = row
            W = T @ (Kc * (b * g)[:, None])  # [L, K]
            U = T @ (Vc * b[:, None])  # [L, V]
            Vn = U - W @ S[h]  # [L, V]
            causal = np.tril(np.ones((L, L), dtype=bool))
            o[start:stop, h] = ((Qc * g[:, None]) @ S[h] + np.where(causal, (Qc @ Kc.T) * decay, 0) @ Vn) * scale
            v_new[start:stop, h] = Vn
            S[h] = S[h] * g[L - 1] + (Kc * decay[L - 1][:, None]).T @ Vn
    return o, v_new, S


CHUNK_MAX_NODES = {"quick": 5, "full": 6}


def _chunk_sides(ref: Reference, tree: TokenTree, x: dict[str, Any], chunk_sizes: Iterable[int]):
    """(reference arrays, {chunk size: chunk-form arrays}): the reference once, the chunk form per chunk size."""
    o_closed, factors = ref.tree_closed_form(*_gdn_args(x), tree, scale=x["scale"])
    _, S_last = ref.chain(*_gdn_args(x), scale=x["scale"])
    reference = {"o": o_closed, "delta": factors.delta, "S_last": S_last}
    chunked = {}
    for chunk_size in chunk_sizes:
        o_chunk, v_new, S_chunk = chunked_gated_delta_rule(*_gdn_args(x), x["scale"], chunk_size)
        chunked[chunk_size] = {"o": o_chunk, "delta": v_new, "S_last": S_chunk}
    return reference, chunked


@check(
    "chunk/sympy",
    claim="on a chain, tree_closed_form outputs and deltas and chain's last state = fla's chunkwise form, "
    "every chunk size",
    docs=DOCS_CLOSED_FORM,
)
def chain_equals_chunk(ctx: Context) -> Outcome:
    max_nodes = CHUNK_MAX_NODES[_scope_key(ctx)]
    dims_list = SYMBOLIC_DIMS[_scope_key(ctx)]
    cases = [(n, d) for n in range(1, max_nodes + 1) for d in dims_list]
    scope = {
        "trees": f"chains of 1..{max_nodes} nodes, every chunk size 1..N",
        "dims": "; ".join(map(str, dims_list)),
        "numbers": "sympy QQ[...] polynomials, every input entry an independent symbol",
    }
    names = ("tree_closed_form / chain", "fla chunk form")
    compared = 0
    for n, dims in ctx.cases(cases, note="chains x dims"):
        tree = TokenTree.chain(n)
        x, _ = symbolic_arrays(InputSpec.gdn(n, dims))
        reference, chunked = _chunk_sides(ctx.ref, tree, x, range(1, n + 1))
        for chunk_size, chunk in chunked.items():
            compared += 1
            entry = first_difference(reference, chunk, lambda d: d == 0)
            if entry is None:
                continue
            rng = random.Random(n)
            example: dict[str, Any] = {"tree": list(tree.parents), "dims": str(dims), "entry": entry}
            for _ in range(COUNTEREXAMPLE_TRIES):
                xf = random_fraction_arrays(InputSpec.gdn(n, dims), rng)
                ref_f, chunk_f = _chunk_sides(ctx.ref, tree, xf, [chunk_size])
                found = first_difference(ref_f, chunk_f[chunk_size], lambda d: d == 0)
                if found is not None:
                    example = _counterexample(
                        tree.parents, dims, xf, found, lookup(ref_f, found), lookup(chunk_f[chunk_size], found), names
                    )
                    break
            example["chunk_size"] = chunk_size
            detail = f"differs at {entry}, chunk size {chunk_size}"
            return Outcome("refuted", scope, detail=detail, counterexample=example)
    return Outcome("proved", scope, detail=f"{compared} (chain, chunk size, dims) cases identical")


# ---------------------------------------------------------------------------------------------------- 4. nilpotent
NILPOTENT_MAX_NODES = {"quick": 6, "full": 7}


def nilpotent_identities(A: np.ndarray, depth: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """For ``A`` strictly supported on ancestors and the tree's depth: the identities a depth-bounded solve uses.

    ``A^(depth+1) = 0``; ``(I + A) series = series (I + A) = I`` with ``series = sum_{m <= depth} (-A)^m``; the
    doubling product ``prod_{k < bitlen(depth)} (I + (-A)^(2^k)) = series``; and for every split point ``h`` the
    inverse by blocks that the kernels use past N = 64 (``optimized.gdn_tree._inverse_unit_lower_halves``, there
    ``h = N / 2``): ``A_12 = 0`` and ``[[T_11, 0], [-T_22 A_21 T_11, T_22]] = series`` with each ``T_ii`` the doubling
    product of the diagonal block ``A_ii`` with the whole tree's ``bitlen(depth)`` factors. Returns name -> (lhs,
    rhs)."""
    n = A.shape[0]
    eye = np.eye(n, dtype=int).astype(object)  # [N, N]
    zero = np.zeros((n, n), dtype=int).astype(object)
    term = eye.copy()
    series = eye.copy()
    for _ in range(depth):
        term = term @ (-A)
        series = series + term
    power = eye.copy()
    for _ in range(depth + 1):
        power = power @ A
    doubling = _doubling_product(A, depth)
    out = {
        "A^(depth+1)": (power, zero),
        "(I+A) series": ((eye + A) @ series, eye),
        "series (I+A)": (series @ (eye + A), eye),
        "doubling product": (doubling, series),
    }
    for h in range(1, n):
        t11 = _doubling_product(A[:h, :h], depth)  # [h, h]
        t22 = _doubling_product(A[h:, h:], depth)  # [N - h, N - h]
        blocks = zero.copy()  # [N, N]
        blocks[:h, :h] = t11
        blocks[h:, h:] = t22
        blocks[h:, :h] = -(t22 @ A[h:, :h] @ t11)
        blocks[:h, h:] = A[:h, h:]  # zero when the nodes are in topological order, as the upper block must be
        out[f"halves at {h}"] = (blocks, series)
    return out


def _doubling_product(A: np.ndarray, depth: int) -> np.ndarray:
    """``prod_{k < bitlen(depth)} (I + (-A)^(2^k))`` of a square block ``A`` (object entries)."""
    eye = np.eye(A.shape[0], dtype=int).astype(object)
    product, square = eye.copy(), -A
    for _ in range(depth.bit_length()):
        product = product @ (eye + square)
        square = square @ square
    return product


@check(
    "nilpotent/sympy",
    claim="(I + A)^{-1} = sum_{m <= depth} (-A)^m = prod_{k < bitlen(depth)} (I + (-A)^(2^k)) for every A "
    "supported on the strict ancestor mask, and = [[T_11, 0], [-T_22 A_21 T_11, T_22]] by blocks at every split",
    docs=DOCS_CLOSED_FORM,
)
def nilpotent_solve(ctx: Context) -> Outcome:
    from .exact import polynomial_ring

    max_nodes = NILPOTENT_MAX_NODES[_scope_key(ctx)]
    shapes = [p for n in range(1, max_nodes + 1) for p in all_parent_arrays(n)]
    scope = {
        "trees": f"all {len(shapes)} parent arrays with 1..{max_nodes} nodes",
        "dims": "A: [N, N], one independent symbol per strict-ancestor entry (any GDN A is an instance)",
        "numbers": "sympy QQ[...] polynomials",
    }
    for parents in ctx.cases(shapes, note="tree shapes"):
        tree = TokenTree(parents)
        n = tree.num_nodes
        strict = np.asarray(ctx.ref.ancestor_mask(tree), dtype=bool) & ~np.eye(n, dtype=bool)  # M°: [N, N]
        depth = int(ctx.ref.max_depth(tree))
        positions = list(zip(*np.nonzero(strict)))
        _, gens = polynomial_ring([f"a_{i}_{j}" for i, j in positions] or ["unused"])
        A = np.zeros((n, n), dtype=int).astype(object)  # [N, N]
        for (i, j), g in zip(positions, gens):
            A[i, j] = g
        identities = nilpotent_identities(A, depth)
        for name, (lhs, rhs) in identities.items():
            entry = first_difference({name: lhs}, {name: rhs}, lambda d: d == 0)
            if entry is None:
                continue
            rng = random.Random(n)
            A_num = np.zeros((n, n), dtype=object)
            for i, j in positions:
                A_num[i, j] = Fraction(rng.randint(1, 5))
            lf, rf = nilpotent_identities(A_num, depth)[name]
            return Outcome(
                "refuted",
                scope,
                detail=f"{name} fails at {entry} with depth = {depth}",
                counterexample={
                    "tree": list(parents),
                    "depth_used": depth,
                    "identity": name,
                    "entry": entry,
                    "A": show(A_num),
                    "lhs": show(lookup({name: lf}, entry)),
                    "rhs": show(lookup({name: rf}, entry)),
                },
            )
    return Outcome("proved", scope, detail=f"{len(shapes)} shapes: all identities hold (four, and the blocks at "
                   "every split)")
