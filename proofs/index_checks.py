"""6. Index safety: the kernels' ancestor-word and path-position arithmetic, proved with Z3 over 32-bit words.

``index/ancestor-words`` runs the reference's own :func:`~lumotree.reference.tree.ancestor_row` and
:func:`~lumotree.reference.tree.mask_bit` on :class:`~lumotree.proofs.machine.Word` terms: a symbolic tree size N,
symbolic nodes ``0 <= p < i < N`` and ``j < N``, and a symbolic (arbitrary) parent row. Z3 proves

- *root*: ``mask_bit(row_0, 0, j) = [j == 0]`` where ``row_0 = ancestor_row(zeros, 0)``;
- *step*: ``mask_bit(row_i, i, j) = [j == i] or mask_bit(row_p, p, j)`` where ``row_i = ancestor_row(row_p, i)``;
- *safety*: every word index is ``< n_words = ceil(N / 32)``, every node index ``< N``, every flat address
  ``node * n_words + word < N * n_words``, every shift amount ``< 32``, no bit is shifted out of a 32-bit word.

The definition of the inclusive ancestor mask satisfies the same recurrence (``M[0, j] = [j == 0]``,
``M[i, j] = [j == i] or M[p_i, j]``), and :func:`~lumotree.reference.tree.ancestor_words` is the fold of
``ancestor_row`` in topological order (``p_i < i``), so by induction over i the words equal the mask for every tree
of up to the stated number of nodes, with no shape enumerated.

``index/positions`` proves the path-position arithmetic the attention kernels use, in 32-bit words: node i sits at
position ``prefix_len + depth(i)`` and its KV is written at slot ``prefix_len + i`` of a cache of ``capacity`` slots.
By induction with ``depth(0) = 0``, ``depth(i) = depth(p_i) + 1``, ``p_i < i``: ``depth(i) <= i``, so when
``prefix_len + N <= capacity < 2^31`` (int32) every position and slot is in ``[prefix_len, capacity)``, nothing wraps,
and ``position(i) <= slot(i)``: compacting an accepted path to slots ``prefix_len + depth`` in path order never
overwrites a node not yet moved.
"""

from __future__ import annotations

from typing import Any

import z3

from lumotree.reference.tree import WORD_BITS, TokenTree

from .core import Context, Outcome, check
from .exact import all_parent_arrays, count_parent_arrays, z3_value
from .machine import Machine, WordRow, WordTable

MAX_NODES = {"quick": 64, "full": 1024}
INT32_MAX = 2**31 - 1


def _solve(premises: list[Any], goal: Any) -> tuple[str, Any]:
    """``proved`` if premises imply goal (negation unsat), else (``refuted``, model) or (``unknown``, reason)."""
    solver = z3.Solver(ctx=goal.ctx)
    solver.set("timeout", 120_000)
    solver.add(*premises)
    solver.add(z3.Not(goal))
    verdict = solver.check()
    if verdict == z3.unsat:
        return "proved", None
    if verdict == z3.sat:
        return "refuted", solver.model()
    return "unknown", solver.reason_unknown()


def _prove_all(
    machine: Machine, premises: list[Any], claims: list[tuple[str, Any]]
) -> tuple[str, str | None, Any]:
    """Claims first, then the machine's obligations; the first that fails gives (status, what, model)."""
    for what, goal in [*claims, *machine.obligations]:
        status, model = _solve(premises, goal)
        if status != "proved":
            return status, what, model
    return "proved", None, None


def _ancestor_word_case(ctx: Context, n_words: int, max_nodes: int, root: bool):
    """One case: trees whose size N needs ``n_words`` words (``32 (n_words - 1) < N <= 32 n_words``)."""
    ref = ctx.ref
    m = Machine()
    N = m.var("N")
    j = m.var("j")
    premises = [N > WORD_BITS * (n_words - 1), N <= min(WORD_BITS * n_words, max_nodes), j < N]
    table = WordTable(m, N)
    if root:
        i = m.const(0)
        parent_row = WordRow(m, [m.const(0) for _ in range(n_words)])
        variables = {"N": N, "j": j}
    else:
        i, p = m.var("i"), m.var("p")
        parent_row = WordRow(m, [m.var(f"parent_word_{w}") for w in range(n_words)])
        table.put(p, parent_row)
        premises += [p < i, i < N]
        variables = {"N": N, "i": i, "p": p, "j": j} | {f"parent_word_{w}": parent_row.words[w] for w in range(n_words)}
    row = ref.ancestor_row(parent_row, i, WORD_BITS)
    table.put(i, row)
    bit_i = m.lift(ref.mask_bit(table, i, j, WORD_BITS))
    if root:
        expected = z3.If(j.eq(i), m.const(1).term, m.const(0).term)
        claim = ("mask_bit(ancestor_row(zeros, 0), 0, j) = [j == 0]", bit_i.eq(expected))
    else:
        bit_p = m.lift(ref.mask_bit(table, p, j, WORD_BITS))
        expected = z3.If(j.eq(i), m.const(1).term, bit_p.term)
        claim = ("mask_bit(ancestor_row(row_p, i), i, j) = [j == i] or mask_bit(row_p, p, j)", bit_i.eq(expected))
    status, what, model = _prove_all(m, premises, [claim])
    example = None
    if status == "refuted":
        example = {name: z3_value(model, w.term) for name, w in variables.items()}
        example |= {
            "claim": what,
            "n_words": n_words,
            "mask_bit(row_i, i, j)": z3_value(model, bit_i.term),
            "expected": z3_value(model, expected),
        }
    return status, what, example


@check(
    "index/ancestor-words",
    claim="ancestor_row / mask_bit in 32-bit words equal the inclusive ancestor mask and never index out of bounds, "
    "every tree up to the stated size",
    docs="index-safety.md",
)
def ancestor_words_safe(ctx: Context) -> Outcome:
    max_nodes = MAX_NODES["quick" if ctx.quick else "full"]
    word_counts = range(1, (max_nodes + WORD_BITS - 1) // WORD_BITS + 1)
    scope = {
        "trees": f"every parent array with 1..{max_nodes} nodes (N, nodes, parent row symbolic; induction over i)",
        "dims": f"WORD_BITS = {WORD_BITS}, n_words = ceil(N / 32) in 1..{len(word_counts)}",
        "numbers": "Z3 32-bit unsigned bit-vectors (the kernels' registers), Python-int semantics as obligations",
    }
    cases = [(n, root) for n in word_counts for root in (True, False)]
    for n_words, root in ctx.cases(cases, note="word counts x (root, step)"):
        status, what, example = _ancestor_word_case(ctx, n_words, max_nodes, root)
        if status == "refuted":
            return Outcome("refuted", scope, detail=f"fails: {what}", counterexample=example)
        if status == "unknown":
            return Outcome("unknown", scope, detail=f"Z3 unknown on {what} ({example})")
    return Outcome("proved", scope, detail=f"{len(cases)} cases (root and step per word count) and all obligations")


DEPTH_CONFORMANCE_MAX_NODES = 7


@check(
    "index/positions",
    claim="depth(i) <= i, so positions prefix_len + depth(i) and KV slots prefix_len + i lie in [prefix_len, "
    "capacity) in int32, and position(i) <= slot(i) (in-place path compaction is safe)",
    docs="index-safety.md",
)
def positions_safe(ctx: Context) -> Outcome:
    max_nodes = MAX_NODES["quick" if ctx.quick else "full"]
    scope = {
        "trees": f"every parent array with 1..{max_nodes} nodes (Z3: induction over i with symbolic i, p_i, depth); "
        f"the reference's depth = the recurrence on all {count_parent_arrays(DEPTH_CONFORMANCE_MAX_NODES)} shapes "
        f"with 1..{DEPTH_CONFORMANCE_MAX_NODES} nodes",
        "dims": "prefix_len, capacity symbolic with prefix_len + N <= capacity <= 2^31 - 1",
        "numbers": "Z3 32-bit unsigned bit-vectors, Python-int semantics as obligations; exact ints",
    }
    # the reference's depth (what attention positions use: cache.length + tree.depth) is the recurrence
    shapes = [p for n in range(1, DEPTH_CONFORMANCE_MAX_NODES + 1) for p in all_parent_arrays(n)]
    for parents in shapes:
        depth = [int(d) for d in ctx.ref.depth(TokenTree(parents))]
        for i, p in enumerate(parents):
            expected = 0 if p < 0 else depth[p] + 1
            if depth[i] != expected:
                return Outcome(
                    "refuted",
                    scope,
                    detail=f"the reference's depth breaks depth(i) = depth(parent(i)) + 1 at node {i}",
                    counterexample={"tree": list(parents), "node": i, "depth": depth, "expected": expected},
                )
    for root in ctx.cases((True, False), note="root, step"):
        m = Machine()
        N, prefix, capacity = m.var("N"), m.var("prefix_len"), m.var("capacity")
        premises = [N >= 1, N <= max_nodes, capacity <= INT32_MAX, _wide(prefix) + _wide(N) <= _wide(capacity)]
        if root:
            i = m.const(0)
            depth_i = m.const(0)
            claims: list[tuple[str, Any]] = []
            variables = {"N": N, "prefix_len": prefix, "capacity": capacity}
        else:
            i, p, depth_p = m.var("i"), m.var("p"), m.var("depth_p")
            premises += [p < i, i < N, depth_p <= p]  # induction hypothesis: depth(p) <= p
            depth_i = depth_p + 1
            claims = [("depth(i) <= i", depth_i <= i), ("depth(i) >= 1", depth_i >= 1)]
            variables = {"N": N, "i": i, "p": p, "depth_p": depth_p, "prefix_len": prefix, "capacity": capacity}
        position = prefix + depth_i
        slot = prefix + i
        claims += [
            ("position >= prefix_len", position >= prefix),
            ("position < capacity", position < capacity),
            ("slot < capacity", slot < capacity),
            ("position <= slot", position <= slot),
        ]
        status, what, model = _prove_all(m, premises, claims)
        if status == "refuted":
            example = {name: z3_value(model, w.term) for name, w in variables.items()}
            example |= {"claim": what, "depth(i)": z3_value(model, depth_i.term)}
            return Outcome("refuted", scope, detail=f"fails: {what}", counterexample=example)
        if status == "unknown":
            return Outcome("unknown", scope, detail=f"Z3 unknown on {what} ({model})")
    return Outcome("proved", scope, detail="depth conformance, then root and step cases with all 32-bit obligations")


def _wide(word: Any) -> Any:
    """A 32-bit word zero-extended to 64 bits: premises add without wrap-around."""
    return z3.ZeroExt(32, word.term)
