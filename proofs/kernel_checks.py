"""Checks that reach the kernels: the inverse schedules the Triton and Gluon kernels run, executed on exact numbers.

The kernels invert ``I + A`` (A strictly lower, on the tree's strict ancestor mask) by doubling, with a round count
computed in the kernel from the tree's depths. These checks run **the kernels' own functions**
(:mod:`~lumotree.proofs.kernel_shim`: their Python source with exact stand-ins for ``tl`` / ``gl``) with **the
launch code's constants**, and require a two-sided inverse ``(I + A) T = T (I + A) = I`` on the whole padded tile:

- the Triton kernels (split solve, one-kernel verify): ``NP = padded_nodes(N)`` and ``LOG_NP`` from
  ``tile_constants(NP)``; the round count ``_levels_of(depth, LOG_NP)`` on the padded depths (padding 0, as
  ``_load_depth`` loads them); ``T = _inverse(-A, levels, NP, ..., OVERLAP, HALVES)`` for both product orders
  (``OVERLAP``: the split solve in the tensor-core modes; the one-kernel form and ``ieee`` square first) and every
  ``HALVES`` that ``use_halves`` allows at that tile (the inverse by diagonal halves from ``NP = 32``);
- the Gluon fused kernel: its tile ``NODES``, the round count ``_doubling_count(depth, LOG_NODES)`` reduced with
  the kernel's ``_larger`` (the consumer takes the maximum of the stored vector), and ``_unit_lower_inverse`` with
  its shared-memory hand-offs (``rows_smem`` / the transposed ``cols_smem`` view), fp32 and fp16 operand forms.

``kernel-solve/sympy`` proves it for A with an independent symbol at every strict-ancestor entry, on every tree up
to the scope, at the launch's tile for that tree; the halves helper also runs at tiles 4 and 8 (which the launch
never uses), so that its split cuts these trees and its off-diagonal block is not zero. ``kernel-solve/deep`` runs
deep and wide trees at every tile the launch uses (16 to 128 nodes for Triton, 64 for Gluon) on one uniformly random
A per tree modulo a prime p near 2^25 (``checked``): ``(I + A) T - I`` is a polynomial of degree at most 257 in A's
entries, so a schedule that is not an inverse passes on a random A with probability at most 257 / p < 10^-5
(Schwartz-Zippel).

Not run: the split solve by row halves (``_gdn_tree_solve_rows_kernel``) forms its off-diagonal block
``T_ll (-A_lu) T_uu`` inline across two programs; its diagonal blocks are the ``_inverse_unit_lower`` run here, its
off-diagonal formula the halves' (run here in ``_inverse_unit_lower_halves``). The depths are the reference's (the
kernels' ``tree_metadata`` is tested against it), the mask the reference's (its bitsets: ``index/ancestor-words``).
Rounding (tf32, fp16) is the kernels' accuracy bound's business: here it is the identity.
"""

from __future__ import annotations

import importlib
import random
from typing import Any

import numpy as np
from lumotree.reference.tree import TokenTree

from .core import Context, Outcome, check
from .exact import all_parent_arrays, polynomial_ring
from .gdn_checks import DOCS_CLOSED_FORM, _scope_key, deep_parent_array
from .kernel_shim import (
    ExactTiles,
    NotModelled,
    Polynomials,
    PrimeField,
    SharedTile,
    Tile,
    executable,
)
from .solve_checks import _strict_positions

KERNEL_MODULES = {
    "config": "lumotree.optimized.ops.gdn_tree.config",
    "primitives": "lumotree.optimized.ops.gdn_tree.primitives",
    "fused": "lumotree.optimized.ops.gdn_tree.fused_kernel",
    "checks": "lumotree.optimized.ops.checks",
}
SYMBOLIC_MAX_NODES = {"quick": 6, "full": 7}
HALVES_TILES = (4, 8)  # the halves helper at tiles where its split cuts trees of the symbolic scope
DEEP_TREES = {  # depths at the round counts' boundaries (16, 32, 64: a power of two) and at each tile's largest
    "quick": (("chain", 33), ("chain", 64), ("broom", 40), ("deep-wide", 100), ("chain", 128)),
    "full": (("chain", 17), ("chain", 33), ("chain", 64), ("broom", 64), ("deep-wide", 64), ("chain", 65),
             ("broom", 100), ("deep-wide", 128), ("chain", 128)),
}
PRIME = 33554393  # the largest prime below 2^25
TRITON_TILES = {  # the Triton tiles the symbolic check runs a small tree at: the launch's own, or every one it may use
    "quick": lambda n, mods: [mods["config"].padded_nodes(n)],
    "full": lambda n, mods: _tiles_of_launch(n, mods),
}


def _kernels() -> dict[str, Any]:
    """The kernel modules, read now (a function replaced in one of them is the one run)."""
    return {key: importlib.import_module(name) for key, name in KERNEL_MODULES.items()}


def _config(config: Any, halves: bool) -> Any:
    """A kernel config whose ``halves`` is ``halves`` (the rest does not reach the inverse)."""
    return config.KernelConfig(block_v=64, block_k=64, num_warps=4, halves=halves)


def _tiles_of_launch(n: int, mods: dict[str, Any]) -> list[int]:
    """Every tile the Triton launch uses for a tree of ``n`` nodes: ``padded_nodes(N)`` for every batch size
    ``N >= n`` up to the kernels' largest."""
    padded = mods["config"].padded_nodes
    return sorted({padded(N) for N in range(n, mods["checks"].MAX_NODES + 1)})


def schedules(neg_a: np.ndarray, depth: np.ndarray, tiles: ExactTiles, mods: dict[str, Any], NP: int,
              kinds: tuple[str, ...] = ("triton", "gluon")) -> dict[str, np.ndarray]:
    """``label -> T`` ``[NP, NP]``: the kernels' inverse schedules at tile ``NP`` for ``-A`` (``[NP, NP]``, zero
    past the tree) and the tree's ``depth`` (``[NP]``, 0 past it). ``kinds``: ``triton`` (every variant the launch
    allows at ``NP``), ``gluon`` (the fused kernel, at its ``NODES`` only), ``halves`` (the halves helper alone, with
    the round count of ``_levels_of``: a tile the launch does not use)."""
    config, prim, fused = mods["config"], mods["primitives"], mods["fused"]
    out: dict[str, np.ndarray] = {}
    neg = tiles.tile(neg_a)
    depth_tile = Tile(np.asarray(depth, dtype=np.int64), tiles.ring)
    levels_of = executable(prim._levels_of, tiles)
    if "triton" in kinds:
        levels = int(levels_of(depth_tile, config.tile_constants(NP)["LOG_NP"]))
        inverse = executable(prim._inverse, tiles)
        halves = sorted({config.use_halves(_config(config, h), NP) for h in (False, True)})
        for overlap in (False, True):
            for half in halves:
                t = inverse(neg, levels, NP, "ieee", overlap, half)
                out[f"triton NP={NP} levels={levels} overlap={overlap} halves={half}"] = t.a
    if "halves" in kinds:
        levels = int(levels_of(depth_tile, NP.bit_length() - 1))
        for overlap in (False, True):
            t = executable(prim._inverse_unit_lower_halves, tiles)(neg, levels, NP, "ieee", overlap)
            out[f"halves helper NP={NP} levels={levels} overlap={overlap}"] = t.a
    if "gluon" in kinds and NP == fused.NODES:
        counts = executable(fused._doubling_count, tiles)(depth_tile, fused.LOG_NODES.value)
        levels = int(tiles.gl.reduce(counts, 0, executable(fused._larger, tiles)))
        unit_lower_inverse = executable(fused._unit_lower_inverse, tiles)
        nodes = tiles.tl.arange(0, NP)
        for fp16 in (False, True):
            rows_smem, cols_smem = SharedTile((NP, NP)), SharedTile((NP, NP))
            a_op = tiles.gl.DotOperandLayout(operand_index=0, parent=tiles.gl.NVMMADistributedLayout(), k_width=1)
            t = unit_lower_inverse(neg, nodes, nodes, cols_smem, rows_smem, levels, a_op, fp16)
            out[f"gluon NODES={NP} levels={levels} fp16={fp16}"] = t.a
    return out


def _inverse_failure(ring: Any, A: np.ndarray, T: np.ndarray) -> tuple[str, tuple[int, int], Any] | None:
    """The first failing identity of ``(I + A) T = I``, ``T (I + A) = I`` (name, entry, value), or None."""
    n = A.shape[0]
    identity = ring.zeros((n, n))
    for i in range(n):
        identity[i, i] = 1
    I_plus_A = ring.reduce(identity + A)
    for name, product in (("(I + A) T", ring.matmul(I_plus_A, T)), ("T (I + A)", ring.matmul(T, I_plus_A))):
        wrong = np.argwhere(np.asarray(ring.reduce(product - identity) != 0, dtype=bool))
        if len(wrong):
            i, j = (int(x) for x in wrong[0])
            return name, (i, j), product[i, j]
    return None


def _padded(tree: TokenTree, values: dict[tuple[int, int], Any], NP: int, ring: Any) -> tuple[np.ndarray, np.ndarray]:
    """(``-A`` ``[NP, NP]`` with ``A[i, j] = values[i, j]``, ``depth`` ``[NP]``), zero past the tree."""
    neg_a = ring.zeros((NP, NP))
    for (i, j), value in values.items():
        neg_a[i, j] = -value
    depth = np.zeros(NP, dtype=np.int64)
    depth[: tree.num_nodes] = np.asarray(tree.depth)
    return ring.reduce(neg_a), depth


def _refuted(scope: dict, tree: TokenTree, label: str, failure: tuple, note: str = "") -> Outcome:
    name, entry, value = failure
    return Outcome("refuted", scope, detail=f"{label}: {name} != I at {entry} on the tree {list(tree.parents)}{note}",
                   counterexample={"tree": list(tree.parents), "schedule": label, "identity": name,
                                   "entry": list(entry), "value": str(value)})


@check(
    "kernel-solve/sympy",
    claim="the inverse schedules the Triton and Gluon kernels run (their own functions, the launch's tile, round "
    "count and variants) are a two-sided inverse of I + A for every A on the strict ancestor mask",
    docs=DOCS_CLOSED_FORM,
    weight=2,
)
def kernel_solve_sympy(ctx: Context) -> Outcome:
    max_nodes = SYMBOLIC_MAX_NODES[_scope_key(ctx)]
    mods = _kernels()
    shapes = [p for n in range(1, max_nodes + 1) for p in all_parent_arrays(n)]
    ring = Polynomials()
    tiles = ExactTiles(ring)
    launch_tiles = sorted({mods["config"].padded_nodes(n) for n in range(1, max_nodes + 1)})
    scope = {
        "trees": f"all {len(shapes)} parent arrays with 1..{max_nodes} nodes",
        "kernels": f"Triton _inverse at the launch tile {launch_tiles} (both product orders, the halves the launch "
                   f"allows), Gluon _unit_lower_inverse at NODES = {mods['fused'].NODES} (fp32 and fp16 forms), "
                   f"_inverse_unit_lower_halves at tiles {list(HALVES_TILES)}; round counts by the kernels' "
                   "_levels_of / _doubling_count",
        "numbers": "sympy QQ[...] polynomials, one symbol per strict-ancestor entry",
    }
    runs = 0
    try:
        for parents in ctx.cases(shapes, note="tree shapes"):
            tree = TokenTree(parents)
            positions = _strict_positions(ctx.ref, tree)
            _, gens = polynomial_ring([f"a_{i}_{j}" for i, j in positions] or ["unused"])
            values = dict(zip(positions, gens))
            runs_here = [(tile, ("triton",)) for tile in TRITON_TILES[_scope_key(ctx)](tree.num_nodes, mods)]
            runs_here += [(mods["fused"].NODES, ("gluon",))]
            runs_here += [(tile, ("halves",)) for tile in HALVES_TILES if tile >= tree.num_nodes]
            for tile, kinds in runs_here:
                neg_a, depth = _padded(tree, values, tile, ring)
                A = ring.reduce(-neg_a)
                for label, T in schedules(neg_a, depth, tiles, mods, tile, kinds).items():
                    runs += 1
                    failure = _inverse_failure(ring, A, T)
                    if failure:
                        return _refuted(scope, tree, label, failure)
    except NotModelled as err:
        return Outcome("unknown", scope, detail=f"a kernel function left the exact model: {err}")
    return Outcome("proved", scope, detail=f"{len(shapes)} shapes, {runs} schedule runs: each a two-sided inverse")


@check(
    "kernel-solve/deep",
    claim="the kernels' inverse schedules invert I + A on deep and wide trees at every tile the launch uses, up to "
    "the kernels' 128 nodes",
    expected="checked",
    docs=DOCS_CLOSED_FORM,
    weight=2,
)
def kernel_solve_deep(ctx: Context) -> Outcome:
    shapes = DEEP_TREES[_scope_key(ctx)]
    mods = _kernels()
    ring = PrimeField(PRIME)
    tiles = ExactTiles(ring)
    scope = {
        "trees": "; ".join(f"{kind} of {n} nodes" for kind, n in shapes),
        "kernels": "Triton _inverse at every launch tile from padded_nodes(n) to 128 (both product orders, the "
                   f"halves the launch allows), Gluon _unit_lower_inverse at NODES = {mods['fused'].NODES} for trees "
                   "that fit it",
        "numbers": f"one uniformly random A per tree modulo p = {PRIME} (a failing schedule passes with probability "
                   "< 1e-5)",
    }
    rng = random.Random(47)
    runs = 0
    try:
        for kind, n in ctx.cases(shapes, note="deep trees"):
            tree = TokenTree(deep_parent_array(kind, n, rng))
            values = {ij: rng.randrange(1, PRIME) for ij in _strict_positions(ctx.ref, tree)}
            for tile in _tiles_of_launch(n, mods):
                neg_a, depth = _padded(tree, values, tile, ring)
                A = ring.reduce(-neg_a)
                for label, T in schedules(neg_a, depth, tiles, mods, tile).items():
                    runs += 1
                    failure = _inverse_failure(ring, A, T)
                    if failure:
                        return _refuted(scope, tree, label, failure, f" (depth {tree.max_depth}, mod {PRIME})")
    except NotModelled as err:
        return Outcome("unknown", scope, detail=f"a kernel function left the exact model: {err}")
    return Outcome("checked", scope, detail=f"{len(shapes)} trees, {runs} schedule runs: each a two-sided inverse")
