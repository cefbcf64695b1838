"""6. Index safety: the ancestor-word and path-position arithmetic the kernels mirror, proved on the reference's code.

``index/ancestor-words`` runs the reference's own :func:`~lumotree.reference.tree.ancestor_row` and
:func:`~lumotree.reference.tree.mask_bit` on :class:`~lumotree.proofs.machine.Word` terms: a symbolic tree size N,
symbolic nodes ``0 <= p < i < N`` and ``j < N``, and a symbolic (arbitrary) parent row. Z3 proves

- *root*: ``mask_bit(row_0, 0, j) = [j == 0]`` where ``row_0 = ancestor_row(zeros, 0)``;
- *step*: ``mask_bit(row_i, i, j) = [j == i] or mask_bit(row_p, p, j)`` where ``row_i = ancestor_row(row_p, i)``;
- *safety*: every word index is ``< n_words = ceil(N / 32)``, every node index ``< N``, every flat address
  ``node * n_words + word < N * n_words``, every shift amount ``< 32``, no bit is shifted out of a 32-bit word.

The definition of the inclusive ancestor mask satisfies the same recurrence (``M[0, j] = [j == 0]``,
``M[i, j] = [j == i] or M[p_i, j]``), so by induction over i the rows equal the mask for every tree of up to the
stated number of nodes. The fold that builds the rows, :func:`~lumotree.reference.tree.ancestor_words` (which parent's
row each node copies, the zero row of the root, the number of words), is run itself: on every parent array up to 7
nodes at word sizes 1, 2, 3 and 32 (so rows of many words occur in small trees) and on deep trees across the 32-bit
word boundaries, its words must give the mask of the parent walk, bit for bit, with no bit past the word size.

``index/positions`` runs the reference's position arithmetic (:func:`~lumotree.reference.tree.child_depth`,
:func:`~lumotree.reference.tree.node_position`, :func:`~lumotree.reference.tree.tree_slot`, the functions the attention
layer and the KV compaction call) on 32-bit words: node i sits at position ``node_position(prefix_len, depth(i))``
and its KV at slot ``tree_slot(prefix_len, i)`` of a cache of ``capacity`` slots. By induction with ``depth(0) = 0``,
``depth(i) = child_depth(depth(p_i))``, ``p_i < i``: ``depth(i) <= i``, so when ``prefix_len + N <= capacity < 2^31``
(int32) every position and slot is in ``[prefix_len, capacity)``, nothing wraps, ``position(i) <= slot(i)``, and a
descendant's slot lies past the node's position: compacting an accepted path in place, root first, never overwrites
a node not yet moved. ``TokenTree.depth`` is checked against the parent walk on every shape up to 7 nodes.

``tree/structure`` checks the tree functions every other check and both sides of every identity rely on
(``path``, ``depth``, ``max_depth``, ``ancestor_mask``, ``is_ancestor``, ``children``, ``leaves``) against the parent
walk written here, on every parent array up to 7 nodes and on deep trees.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import z3

from lumotree.reference.tree import WORD_BITS, TokenTree

from .core import Context, Outcome, Reference, check
from .exact import all_parent_arrays, count_parent_arrays, z3_solver, z3_value
from .machine import Machine, WordRow, WordTable

MAX_NODES = {"quick": 64, "full": 1024}
INT32_MAX = 2**31 - 1


def _solve(premises: list[Any], goal: Any) -> tuple[str, Any]:
    """``proved`` if premises imply goal (negation unsat), else (``refuted``, model) or (``unknown``, reason)."""
    solver = z3_solver(goal.ctx)
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


# the fold, run on every small tree (rows of many words at small word sizes) and on deep trees across 32-bit words
FOLD_MAX_NODES = 7
FOLD_WORD_BITS = (1, 2, 3, WORD_BITS)
DEEP_SIZES = (31, 32, 33, 63, 64, 65, 97, 130)


def walk(parents: tuple[int, ...], i: int) -> list[int]:
    """Node i and its ancestors, i first: the definition every structure check compares with."""
    out = []
    while i >= 0:
        out.append(i)
        i = parents[i]
    return out


def deep_shapes(rng: random.Random) -> list[tuple[int, ...]]:
    """Chains, stars and random trees of :data:`DEEP_SIZES` nodes (across the 32-bit word boundaries)."""
    shapes = []
    for n in DEEP_SIZES:
        shapes.append((-1, *range(n - 1)))
        shapes.append((-1, *([0] * (n - 1))))
        shapes.append((-1, *(rng.randrange(max(0, i - 3), i) for i in range(1, n))))  # deep and bushy
    return shapes


def _fold_failure(ref: Reference, parents: tuple[int, ...], word_bits: int) -> dict[str, Any] | None:
    """Where ``ancestor_words(parents, word_bits)`` read by ``mask_bit`` differs from the parent walk, or a row has
    the wrong number of words or a bit past the word size; None if it never does."""
    n = len(parents)
    try:
        words = ref.tree.ancestor_words(list(parents), word_bits)
    except (IndexError, ValueError, TypeError) as err:  # the fold is defined on every valid parent array
        return {"tree": list(parents), "word_bits": word_bits, "claim": "the fold runs", "error": repr(err)}
    n_words = (n + word_bits - 1) // word_bits
    if len(words) != n or any(len(row) != n_words for row in words):
        return {"tree": list(parents), "word_bits": word_bits, "claim": f"{n} rows of {n_words} words",
                "rows": len(words), "words_per_row": sorted({len(row) for row in words})}
    for i in range(n):
        if any(not 0 <= int(w) < 2**word_bits for w in words[i]):
            return {"tree": list(parents), "word_bits": word_bits, "node": i, "claim": "words fit the word size",
                    "row": [int(w) for w in words[i]]}
        ancestors = set(walk(parents, i))
        for j in range(n):
            bit = int(ref.mask_bit(words, i, j, word_bits))
            if bit != (j in ancestors):
                return {"tree": list(parents), "word_bits": word_bits, "node": i, "j": j, "mask_bit": bit,
                        "expected": int(j in ancestors), "claim": "mask_bit(ancestor_words(parents), i, j) = M[i, j]"}
    return None


@check(
    "index/ancestor-words",
    claim="ancestor_row / mask_bit in 32-bit words equal the inclusive ancestor mask and never index out of bounds, "
    "every tree up to the stated size; the fold ancestor_words builds exactly those rows",
    docs="index-safety.md",
    weight=2,
)
def ancestor_words_safe(ctx: Context) -> Outcome:
    max_nodes = MAX_NODES["quick" if ctx.quick else "full"]
    word_counts = range(1, (max_nodes + WORD_BITS - 1) // WORD_BITS + 1)
    small = [p for n in range(1, FOLD_MAX_NODES + 1) for p in all_parent_arrays(n)]
    deep = deep_shapes(random.Random(3))
    scope = {
        "trees": f"every parent array with 1..{max_nodes} nodes (N, nodes, parent row symbolic; induction over i); "
        f"the fold run on all {len(small)} parent arrays with 1..{FOLD_MAX_NODES} nodes and on {len(deep)} chains, "
        f"stars and deep random trees of {', '.join(map(str, DEEP_SIZES))} nodes",
        "dims": f"WORD_BITS = {WORD_BITS}, n_words = ceil(N / 32) in 1..{len(word_counts)}; the fold at word sizes "
        f"{', '.join(map(str, FOLD_WORD_BITS))} (deep trees at 32)",
        "numbers": "Z3 32-bit unsigned bit-vectors (the kernels' registers), Python-int semantics as obligations; "
        "exact ints for the fold",
    }
    cases = [(n, root) for n in word_counts for root in (True, False)]
    for n_words, root in ctx.cases(cases, note="word counts x (root, step)"):
        status, what, example = _ancestor_word_case(ctx, n_words, max_nodes, root)
        if status == "refuted":
            return Outcome("refuted", scope, detail=f"fails: {what}", counterexample=example)
        if status == "unknown":
            return Outcome("unknown", scope, detail=f"Z3 unknown on {what} ({example})")
    folds = [(p, b) for p in small for b in FOLD_WORD_BITS] + [(p, WORD_BITS) for p in deep]
    for parents, word_bits in ctx.cases(folds, note="the fold"):
        failure = _fold_failure(ctx.ref, parents, word_bits)
        if failure is not None:
            return Outcome("refuted", scope, detail=f"ancestor_words breaks {failure['claim']} ({len(parents)} "
                           f"nodes, {word_bits}-bit words)", counterexample=failure)
    return Outcome("proved", scope, detail=f"{len(cases)} Z3 cases (root and step per word count) and all "
                   f"obligations; the fold on {len(folds)} (tree, word size) cases")


DEPTH_CONFORMANCE_MAX_NODES = 7


@check(
    "index/positions",
    claim="the reference's depth, node_position and tree_slot give positions prefix_len + depth(i) and KV slots "
    "prefix_len + i in [prefix_len, capacity) in int32, position(i) <= slot(i) and every descendant's slot past "
    "position(i) (in-place path compaction is safe)",
    docs="index-safety.md",
)
def positions_safe(ctx: Context) -> Outcome:
    tree_module = ctx.ref.need("tree")
    max_nodes = MAX_NODES["quick" if ctx.quick else "full"]
    scope = {
        "trees": f"every parent array with 1..{max_nodes} nodes (Z3: induction over i with symbolic i, p_i, depth); "
        f"the reference's depth = the length of the parent walk on all "
        f"{count_parent_arrays(DEPTH_CONFORMANCE_MAX_NODES)} shapes with 1..{DEPTH_CONFORMANCE_MAX_NODES} nodes",
        "dims": "prefix_len, capacity symbolic with prefix_len + N <= capacity <= 2^31 - 1",
        "numbers": "Z3 32-bit unsigned bit-vectors running child_depth, node_position, tree_slot; Python-int semantics "
        "as obligations; exact ints",
    }
    # the reference's depth (what attention positions use) is the number of edges to the root
    shapes = [p for n in range(1, DEPTH_CONFORMANCE_MAX_NODES + 1) for p in all_parent_arrays(n)]
    for parents in shapes:
        depth = [int(d) for d in ctx.ref.depth(TokenTree(parents))]
        for i in range(len(parents)):
            expected = len(walk(parents, i)) - 1
            if depth[i] != expected:
                return Outcome(
                    "refuted",
                    scope,
                    detail=f"the reference's depth of node {i} is {depth[i]}, its parent walk has {expected} edges",
                    counterexample={"tree": list(parents), "node": i, "depth": depth, "expected": expected},
                )
    for root in ctx.cases((True, False), note="root, step"):
        m = Machine()
        N, prefix, capacity = m.var("N"), m.var("prefix_len"), m.var("capacity")
        premises = [N >= 1, N <= max_nodes, capacity <= INT32_MAX, _wide(prefix) + _wide(N) <= _wide(capacity)]
        claims: list[tuple[str, Any]] = []
        if root:
            i = m.const(0)
            depth_i = m.const(0)  # the root's depth (checked above: TokenTree.depth[0] = 0 on every shape)
            variables = {"N": N, "prefix_len": prefix, "capacity": capacity}
        else:
            i, p, depth_p = m.var("i"), m.var("p"), m.var("depth_p")
            premises += [p < i, i < N, depth_p <= p]  # induction hypothesis: depth(p) <= p
            depth_i = m.lift(tree_module.child_depth(depth_p))
            claims = [("depth(i) <= i", depth_i <= i), ("depth(i) >= 1", depth_i >= 1)]
            variables = {"N": N, "i": i, "p": p, "depth_p": depth_p, "prefix_len": prefix, "capacity": capacity}
        position = m.lift(tree_module.node_position(prefix, depth_i))
        slot = m.lift(tree_module.tree_slot(prefix, i))
        # a descendant d of i (i < d < N, depth(i) < depth(d) <= d by the induction hypothesis) is moved later
        d, depth_d = m.var("d"), m.var("depth_d")
        premises += [i < d, d < N, depth_i < depth_d, depth_d <= d]
        claims += [
            ("position >= prefix_len", position >= prefix),
            ("position < capacity", position < capacity),
            ("slot >= prefix_len", slot >= prefix),
            ("slot < capacity", slot < capacity),
            ("position <= slot", position <= slot),
            ("slot(d) > position(i) for a descendant d", m.lift(tree_module.tree_slot(prefix, d)) > position),
        ]
        status, what, model = _prove_all(m, premises, claims)
        if status == "refuted":
            example = {name: z3_value(model, w.term) for name, w in variables.items()}
            example |= {"claim": what, "depth(i)": z3_value(model, depth_i.term),
                        "position": z3_value(model, position.term), "slot": z3_value(model, slot.term)}
            return Outcome("refuted", scope, detail=f"fails: {what}", counterexample=example)
        if status == "unknown":
            return Outcome("unknown", scope, detail=f"Z3 unknown on {what} ({model})")
    return Outcome("proved", scope, detail="depth conformance, then root and step cases with all 32-bit obligations")


def _wide(word: Any) -> Any:
    """A 32-bit word zero-extended to 64 bits: premises add without wrap-around."""
    return z3.ZeroExt(32, word.term)


# ---------------------------------------------------------------------------------------------------- structure
STRUCTURE_MAX_NODES = {"quick": 7, "full": 8}


def _structure_failure(ref: Reference, parents: tuple[int, ...]) -> dict[str, Any] | None:
    tree = TokenTree(parents)
    n = len(parents)
    mask = np.asarray(ref.ancestor_mask(tree), dtype=bool)
    depth = [int(x) for x in ref.depth(tree)]
    for i in range(n):
        up = walk(parents, i)
        facts = {
            "path(i) = the parent walk, root first": (list(tree.path(i)), up[::-1]),
            "depth(i) = edges to the root": (depth[i], len(up) - 1),
            "ancestor_mask[i] = the walk": (sorted(int(j) for j in np.flatnonzero(mask[i])), sorted(up)),
            "is_ancestor(j, i) = j on the walk": ([tree.is_ancestor(j, i) for j in range(n)],
                                                  [j in up for j in range(n)]),
            "children(i) = nodes whose parent is i": (list(tree.children(i)), [c for c in range(n) if
                                                                                parents[c] == i]),
        }
        for claim, (got, want) in facts.items():
            if got != want:
                return {"tree": list(parents), "node": i, "claim": claim, "reference": got, "expected": want}
    globals_ = {
        "max_depth = the deepest walk": (int(ref.max_depth(tree)), max(len(walk(parents, i)) for i in range(n)) - 1),
        "leaves = nodes without children": (list(tree.leaves), [i for i in range(n) if i not in parents]),
    }
    for claim, (got, want) in globals_.items():
        if got != want:
            return {"tree": list(parents), "claim": claim, "reference": got, "expected": want}
    return None


@check(
    "tree/structure",
    claim="path, depth, max_depth, ancestor_mask, is_ancestor, children and leaves of TokenTree agree with the parent "
    "walk (the definition every other check relies on)",
    docs="conventions.md",
)
def tree_structure(ctx: Context) -> Outcome:
    max_nodes = STRUCTURE_MAX_NODES["quick" if ctx.quick else "full"]
    shapes = [p for n in range(1, max_nodes + 1) for p in all_parent_arrays(n)] + deep_shapes(random.Random(4))
    scope = {
        "trees": f"all {count_parent_arrays(max_nodes)} parent arrays with 1..{max_nodes} nodes, and chains, stars and "
        f"deep random trees of {', '.join(map(str, DEEP_SIZES))} nodes",
        "dims": "every node (and every pair for the mask)",
        "numbers": "exact ints",
    }
    for parents in ctx.cases(shapes, note="shapes"):
        failure = _structure_failure(ctx.ref, parents)
        if failure is not None:
            return Outcome("refuted", scope, detail=f"{failure['claim']} fails on {len(parents)} nodes",
                           counterexample=failure)
    return Outcome("proved", scope, detail=f"{len(shapes)} shapes, every node: the tree functions are the parent walk")
