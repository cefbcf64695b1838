r"""The kernels' index arithmetic, proved from the kernels themselves: the Triton kernels of the portable GDN verify,
the GDN commits, the decode step, tree attention and the tree convolution (:mod:`lumotree.optimized.ops`; not the
GEMV's, not the Gluon fused verify), compiled to TTIR for sm_90 exactly as their launch code launches them, for every
size the launch admits. Not claimed: races between programs, float values.

Each check runs the launch functions themselves on ``meta`` tensors (:mod:`~lumotree.proofs.kernel_launch`: the
grids, arguments and constexprs they compute, as polynomials in the symbolic sizes), compiles each recorded kernel
(:mod:`~lumotree.proofs.kernel_ir`) and proves with Z3 over exact integers (:mod:`~lumotree.proofs.kernel_proof`):
(a) no integer op that feeds an address, a mask or a descriptor coordinate overflows its type (i32 or i64), no
``trunci`` loses bits; (b) every access a mask lets through lies inside its tensor (pointers: the view's span;
descriptors: the block's first element). The sizes are bounded only by the launch's own validation, CUDA's grid
limits and a tensor's storage of at most 512 GiB; loaded indices (slots, sizes, parents, accepted nodes, cache
lengths) within the ranges the launch code validates (:data:`CONTRACTS`). Accesses through indices computed from
the tree's bitsets (a path's nodes) get the overflow claims only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .core import Context, Outcome, check
from .kernel_launch import LaunchConfig

__all__ = ["CONTRACTS", "prove_configs"]

#: loaded index tensors and the ranges the launch code validates for their elements (``s``: the sizes)
CONTRACTS: dict[str, Callable[[dict], tuple[Any, Any]]] = {
    "slots_ptr": lambda s: (0, s["P"] - 1),  # checks.check_slots
    "Slots": lambda s: (0, s["P"] - 1),
    "num_nodes_ptr": lambda s: (1, s["N"]),  # checks.check_num_nodes
    "NumNodes": lambda s: (1, s["N"]),
    "tc_num_nodes_ptr": lambda s: (1, s["N"]),
    "accepted_ptr": lambda s: (0, s["N"] - 1),  # checks.check_node_index
    "Accepted": lambda s: (0, s["N"] - 1),
    "parents_ptr": lambda s: (-1, s["N"] - 2),  # checks.check_tree_rows (parents[i] < i)
    "Parents": lambda s: (-1, s["N"] - 2),
    "tc_parents_ptr": lambda s: (-1, s["N"] - 2),
    "depth_ptr": lambda s: (0, s["N"] - 1),  # tree_meta.tree_metadata of validated trees
    "Lens": lambda s: (0, s["C"] - s["N"]),  # checks.check_lens_fit (cache_lens + N <= C)
}


@dataclass
class FamilyResult:
    status: str = "proved"
    detail: str = ""
    counterexample: dict[str, Any] | None = None
    lines: list[str] = field(default_factory=list)
    kernels: set[str] = field(default_factory=set)
    accesses: int = 0
    bounded: int = 0
    ops: int = 0


def prove_configs(ctx: Context, configs: list[LaunchConfig]) -> FamilyResult:
    """Every launch of every config (quick: those marked ``quick``), stopping at the first refutation."""
    import z3

    from .kernel_ir import JitWorld
    from .kernel_launch import fit
    from .kernel_proof import make_box, prove_launch
    from .ttir_model import Unsupported

    world = JitWorld()
    out = FamilyResult()
    chosen = [c for c in configs if c.quick or not ctx.quick]
    for config in ctx.cases(chosen, note="launch configs"):
        z3ctx = z3.Context()
        try:
            launches, limits = fit(lambda sizes: config.make(config.fixed | sizes), list(config.dims))
            relations = [lambda s: s["B"] <= s["P"]] if config.distinct_slots else []
            box = make_box(list(config.dims), launches, limits, relations, z3ctx)
        except (ValueError, Unsupported) as err:
            out.status, out.detail = "unknown", f"{config.what}: the launch could not be read ({err})"
            return out
        contracts = {name: (lambda f: lambda symbols: f(symbols | config.fixed))(f) for name, f in CONTRACTS.items()}
        ranges = ", ".join(f"{n} in [{lo}, {hi}]" for n, (lo, hi) in box.ranges.items())
        for launch in launches:
            try:
                result = prove_launch(world, launch, box, contracts, z3ctx)
            except Unsupported as err:
                out.status, out.detail = "unknown", f"{config.what}, {launch.name}: {err}"
                return out
            out.kernels.add(launch.name)
            out.accesses += result.accesses
            out.bounded += result.bounded
            out.ops += result.ops
            if result.status != "proved":
                out.status = result.status
                out.detail = f"{config.what}, {launch.name}: {result.detail}"
                out.counterexample = (result.counterexample or {}) | {"config": config.what,
                                                                     "notes": result.notes}
                return out
        out.lines.append(f"{config.what} ({ranges})")
    return out


def _outcome(result: FamilyResult, scope: dict[str, str]) -> Outcome:
    scope = scope | {"launches": "; ".join(result.lines) or "none"}
    if result.status != "proved":
        return Outcome(result.status, scope, detail=result.detail, counterexample=result.counterexample)
    return Outcome("proved", scope, detail=f"{len(result.kernels)} kernels, {result.ops} integer ops in address "
                   f"cones, {result.accesses} accesses ({result.bounded} with their bounds, the others through "
                   "gathered indices: overflow only)")


NOT_CLAIMED = "races (two programs writing one address); float values; loaded data beyond the validated indices"
NUMBERS = ("Z3 integers (exact); each op's result claimed within its TTIR type (i32 / i64, signed), each trunci "
           "lossless; sizes bounded by the launch's validation, CUDA's grid limits and 512 GiB per tensor")


def _check(name: str, claim: str, configs: Callable[[], list[LaunchConfig]], not_covered: str,
           weight: float = 1.0) -> None:
    def run(ctx: Context) -> Outcome:
        chosen = configs()
        result = prove_configs(ctx, chosen)
        scope = {"kernels": ", ".join(sorted(result.kernels)) or "none", "numbers": NUMBERS,
                 "not covered": f"{not_covered}; {NOT_CLAIMED}"}
        return _outcome(result, scope)

    run.__name__ = name.replace("/", "_").replace("-", "_")
    check(name, claim=claim, docs="proofs.md", weight=weight)(run)


from . import kernel_index_configs as configs  # noqa: E402  (the launch configs register the checks below)

_check("kernels/gdn-verify", "the portable GDN tree verify's kernels (tree metadata, split solve, solve by row "
       "halves, apply, one-kernel verify) never overflow an index and never access outside their tensors, for every "
       "batch, pool and tree size the launch admits", configs.gdn_verify,
       "the fused sm_90 verify (Gluon, not TTIR); accesses through a path's nodes (bounds)", weight=2)
_check("kernels/gdn-commit", "the GDN commits (in place, one layer or stacked layers; the pending record and flush) "
       "never overflow an index and never access outside their tensors", configs.gdn_commit,
       "accesses through the accepted path's nodes (overflow only)", weight=2)
_check("kernels/gdn-decode", "the decode step's kernels (conv step, fused recurrent step, gated RMSNorm) never "
       "overflow an index and never access outside their tensors", configs.gdn_decode, "the GEMV's conv epilogue")
_check("kernels/attention", "tree attention (one split and split-K with its combine), prepare_qkv and kv_commit "
       "never overflow an index and never access outside their tensors or the KV cache pool",
       configs.attention, "accesses through the accepted path's nodes (kv_commit: overflow only)", weight=2)
_check("kernels/tree-conv", "the tree convolution and its conv-state commit never overflow an index and never "
       "access outside their tensors", configs.tree_conv, "the GEMV's tree-conv epilogue")
