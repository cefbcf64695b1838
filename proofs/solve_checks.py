"""Checks of the solve: the chain (chunk) form, and every schedule of ``reference/solve.py`` on tree-supported A.

1. ``chunk/sympy``: on a chain, the closed form equals flash-linear-attention's chunkwise (UT transform) form, written
   out independently below, for every chunk size.
2. ``nilpotent/sympy``: for A with an independent symbol at every strict-ancestor entry of the reference's mask,
   ``A^(depth + 1) = 0`` with the reference's depth, and every schedule of the reference's solve
   (``solve_unit_lower``: forward substitution, the doubling product with ``doubling_levels(depth)`` factors, the
   inverse by halves at the kernels' split) and the inverse by halves at *every* split is a two-sided inverse of
   ``I + A``: ``(I + A) T = T (I + A) = I``. The property is checked, not a formula for T.
3. ``nilpotent/deep``: the same on trees past the kernels' 64 and 128 padded nodes, for random integer A (exact).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

import numpy as np

from lumotree.reference.tree import TokenTree

from .core import Context, Outcome, Reference, check
from .exact import (
    Dims,
    InputSpec,
    all_parent_arrays,
    first_difference,
    lookup,
    polynomial_ring,
    random_fraction_arrays,
    show,
    symbolic_arrays,
)
from .gdn_checks import (
    COUNTEREXAMPLE_TRIES,
    DOCS_CLOSED_FORM,
    GVA,
    _counterexample,
    _gdn_args,
    _scope_key,
    deep_parent_array,
)


# ---------------------------------------------------------------------------------------------------- chain = chunk
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


CHUNK_SCOPE = {"quick": ((5, Dims(H=1, HV=2, K=2, V=2)), (4, GVA)), "full": ((6, Dims(H=1, HV=2, K=2, V=2)), (6, GVA))}


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
    weight=3,
)
def chain_equals_chunk(ctx: Context) -> Outcome:
    chunk_scope = CHUNK_SCOPE[_scope_key(ctx)]
    cases = [(n, d) for max_nodes, d in chunk_scope for n in range(1, max_nodes + 1)]
    scope = {
        "trees": "; ".join(f"chains of 1..{n} nodes ({d})" for n, d in chunk_scope) + ", every chunk size 1..N",
        "dims": "; ".join(str(d) for _, d in chunk_scope),
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




# ---------------------------------------------------------------------------------------------------- nilpotent
NILPOTENT_MAX_NODES = {"quick": 6, "full": 7}
NILPOTENT_DEEP = {
    "quick": (("chain", 70), ("deep-wide", 100)),
    "full": (("chain", 130), ("deep-wide", 130), ("broom", 130), ("chain", 65), ("chain", 64), ("chain", 33)),
}


def solve_inverses(ref: Reference, tree: TokenTree, A: np.ndarray, every_split: bool) -> dict[str, np.ndarray]:
    """``name -> T`` for every way the reference inverts ``I + A``: ``solve_unit_lower`` with each schedule (on the
    identity right-hand side; ``"halves"`` splits where the kernels do) and, with ``every_split``,
    ``inverse_by_halves`` at every split point."""
    solve = ref.need("solve")
    n = tree.num_nodes
    eye = np.eye(n, dtype=int).astype(object)  # [N, N]
    out = {f"solve_unit_lower({s!r})": solve.solve_unit_lower(A, eye.copy(), tree, s) for s in solve.SCHEDULES}
    levels = solve.doubling_levels(int(ref.max_depth(tree)))
    for h in range(1, n) if every_split else ():
        out[f"inverse_by_halves(split {h})"] = solve.inverse_by_halves(A, levels, h)
    return out


def inverse_failures(
    ref: Reference, tree: TokenTree, A: np.ndarray, every_split: bool = True
) -> Iterable[tuple[str, str, Any, Any]]:
    """``(identity, entry, lhs, rhs)`` for each claim that fails: ``A^(depth + 1) = 0`` and, for every inverse T of
    :func:`solve_inverses`, ``(I + A) T = I`` and ``T (I + A) = I``."""
    n = tree.num_nodes
    eye = np.eye(n, dtype=int).astype(object)  # [N, N]
    depth = int(ref.max_depth(tree))
    power = eye.copy()
    for _ in range(depth + 1):
        power = power @ A
    claims = {"A^(depth+1) = 0": (power, eye * 0)}
    for name, T in solve_inverses(ref, tree, A, every_split).items():
        T = np.asarray(T, dtype=object)
        claims[f"(I + A) {name} = I"] = ((eye + A) @ T, eye)
        claims[f"{name} (I + A) = I"] = (T @ (eye + A), eye)
    for name, (lhs, rhs) in claims.items():
        entry = first_difference({name: lhs}, {name: rhs}, lambda d: d == 0)
        if entry is not None:
            yield name, entry, lookup({name: lhs}, entry), lookup({name: rhs}, entry)


def _strict_positions(ref: Reference, tree: TokenTree) -> list[tuple[int, int]]:
    n = tree.num_nodes
    strict = np.asarray(ref.ancestor_mask(tree), dtype=bool) & ~np.eye(n, dtype=bool)  # M°: [N, N]
    return [(int(i), int(j)) for i, j in zip(*np.nonzero(strict))]


def _matrix(n: int, values: dict[tuple[int, int], Any]) -> np.ndarray:
    A = np.zeros((n, n), dtype=int).astype(object)  # [N, N]
    for (i, j), value in values.items():
        A[i, j] = value
    return A


@check(
    "nilpotent/sympy",
    claim="A^(depth+1) = 0 and every schedule of the reference's solve (substitution, doubling product, inverse by "
    "halves at the kernels' split and at every split) is a two-sided inverse of I + A, for every A supported on the "
    "reference's strict ancestor mask",
    docs=DOCS_CLOSED_FORM,
    weight=2,
)
def nilpotent_solve(ctx: Context) -> Outcome:
    max_nodes = NILPOTENT_MAX_NODES[_scope_key(ctx)]
    shapes = [p for n in range(1, max_nodes + 1) for p in all_parent_arrays(n)]
    scope = {
        "trees": f"all {len(shapes)} parent arrays with 1..{max_nodes} nodes",
        "dims": "A: [N, N], one independent symbol per strict-ancestor entry (any GDN A is an instance)",
        "numbers": "sympy QQ[...] polynomials",
    }
    checked = 0
    for parents in ctx.cases(shapes, note="tree shapes"):
        tree = TokenTree(parents)
        positions = _strict_positions(ctx.ref, tree)
        _, gens = polynomial_ring([f"a_{i}_{j}" for i, j in positions] or ["unused"])
        for identity, entry, _, _ in inverse_failures(ctx.ref, tree, _matrix(tree.num_nodes, dict(zip(positions,
                                                                                                     gens)))):
            rng = random.Random(tree.num_nodes)
            A_num = _matrix(tree.num_nodes, {ij: Fraction(rng.randint(1, 5)) for ij in positions})
            found = next((f for f in inverse_failures(ctx.ref, tree, A_num) if f[0] == identity), None)
            return Outcome(
                "refuted",
                scope,
                detail=f"{identity} fails at {entry} with depth = {int(ctx.ref.max_depth(tree))}",
                counterexample={
                    "tree": list(parents),
                    "depth_used": int(ctx.ref.max_depth(tree)),
                    "identity": identity,
                    "entry": entry,
                    "A": show(A_num),
                    "lhs": show(found[2]) if found else None,
                    "rhs": show(found[3]) if found else None,
                },
            )
        checked += 1
    return Outcome("proved", scope, detail=f"{checked} shapes: A^(depth+1) = 0, every schedule and every split "
                   "inverts I + A on both sides")


@check(
    "nilpotent/deep",
    claim="every schedule of the reference's solve inverts I + A on trees past the kernels' 64 and 128 padded nodes",
    expected="checked",
    docs=DOCS_CLOSED_FORM,
    weight=2,
)
def nilpotent_deep(ctx: Context) -> Outcome:
    shapes = NILPOTENT_DEEP[_scope_key(ctx)]
    scope = {
        "trees": "; ".join(f"{kind} of {n} nodes" for kind, n in shapes),
        "dims": "A: [N, N] on the strict ancestor mask",
        "numbers": "exact integers: one random A per tree with entries in {-2, -1, 1, 2} (Python ints, no rounding)",
    }
    rng = random.Random(5)
    for kind, n in ctx.cases(shapes, note="deep trees"):
        tree = TokenTree(deep_parent_array(kind, n, rng))
        A = _matrix(n, {ij: rng.choice((-2, -1, 1, 2)) for ij in _strict_positions(ctx.ref, tree)})
        for identity, entry, lhs, rhs in inverse_failures(ctx.ref, tree, A, every_split=False):
            return Outcome(
                "refuted",
                scope,
                detail=f"{identity} fails at {entry} on a {kind} of {n} nodes (depth {tree.max_depth})",
                counterexample={"tree": list(tree.parents), "identity": identity, "entry": entry, "lhs": str(lhs),
                                "rhs": str(rhs)},
            )
    return Outcome("checked", scope, detail=f"{len(shapes)} deep trees: every schedule inverts I + A exactly")
