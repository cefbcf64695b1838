"""The check registry, results, the seam to the reference, and the runner.

A *check* is a function registered with :func:`check`. It receives a :class:`Context` (the reference functions to
run, through the :class:`Reference` seam; the scope, quick or full; a progress callback) and returns an
:class:`Outcome`. The runner times it and turns it into a :class:`CheckResult`.

Statuses: ``proved`` (symbolic identity or an unsat negation over the whole stated scope, or an exhaustive exact
enumeration), ``checked`` (exact agreement on random samples only), ``refuted`` (a concrete counterexample is attached),
``unknown`` (the solver gave up, a needed reference function does not exist yet, or the reference raised).
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "STATUSES",
    "CheckResult",
    "CheckSpec",
    "Context",
    "Outcome",
    "REGISTRY",
    "Reference",
    "check",
    "default_reference",
    "run_check",
    "run_checks",
    "select_checks",
]

STATUSES = ("proved", "checked", "refuted", "unknown")


# ---------------------------------------------------------------------------------------------------- the seam
@dataclass(frozen=True)
class Reference:
    """The reference functions every check calls. Tests substitute a subtly wrong one with ``dataclasses.replace``
    and expect the matching check to come out ``refuted``.

    A field that is ``None`` is a part of the reference that does not exist yet: checks needing it report
    ``unknown``.
    """

    # reference/gdn.py
    chain: Callable[..., Any]
    tree_recurrent: Callable[..., Any]
    tree_closed_form: Callable[..., Any]
    commit: Callable[..., Any]
    # reference/tree.py: the structure the solve and the kernels rely on
    ancestor_mask: Callable[[Any], Any]  # tree -> [N, N] bool, inclusive
    max_depth: Callable[[Any], int]  # tree -> deepest node's depth
    ancestor_row: Callable[..., Any]  # (parent_row, node, word_bits) -> row
    mask_bit: Callable[..., Any]  # (words, i, j, word_bits) -> 0 | 1
    depth: Callable[[Any], Any]  # tree -> [N] depths
    # the layer parts (reference/gdn.py layer part, reference/attention.py), verification (reference/verify.py), the
    # solve schedules (reference/solve.py), the tree module (reference/tree.py: the word fold, depth and position
    # arithmetic) and the hybrid model (reference/model.py) are looked up by name in these modules; None while the
    # module does not exist
    layer: Any = None
    attention: Any = None
    verify: Any = None
    solve: Any = None
    tree: Any = None
    model: Any = None

    def need(self, field_name: str) -> Any:
        """The named field, or raise :class:`Unavailable` if that part of the reference does not exist yet."""
        value = getattr(self, field_name)
        if value is None:
            raise Unavailable(f"the reference has no {field_name!r} part yet")
        return value


class Unavailable(Exception):
    """A reference part a check needs is missing: the check reports ``unknown``, naming it."""


def _optional_module(name: str) -> Any:
    import importlib

    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name == name:
            return None
        raise


def default_reference() -> Reference:
    """The project's reference, read from its modules now (so a monkeypatched module attribute is picked up)."""
    from lumotree.reference import gdn, tree

    return Reference(
        chain=gdn.chain,
        tree_recurrent=gdn.tree_recurrent,
        tree_closed_form=gdn.tree_closed_form,
        commit=gdn.commit,
        ancestor_mask=lambda t: t.ancestor_mask,
        max_depth=lambda t: t.max_depth,
        ancestor_row=tree.ancestor_row,
        mask_bit=tree.mask_bit,
        depth=lambda t: t.depth,
        layer=gdn,
        attention=_optional_module("lumotree.reference.attention"),
        verify=_optional_module("lumotree.reference.verify"),
        solve=_optional_module("lumotree.reference.solve"),
        tree=tree,
        model=_optional_module("lumotree.reference.model"),
    )


# ---------------------------------------------------------------------------------------------------- results
@dataclass
class Outcome:
    """What a check function returns; the runner adds the name and the time."""

    status: str
    scope: dict[str, str]
    detail: str = ""
    counterexample: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status = {self.status!r} is not one of {STATUSES}")


@dataclass
class CheckResult:
    """One check's result: ``name``, ``status``, the ``scope`` it covers (tree shapes, dimensions, number system),
    ``seconds``, a ``counterexample`` on refutation, and the status the project ``expected``.
    """

    name: str
    status: str
    scope: dict[str, str]
    seconds: float
    expected: str = "proved"
    detail: str = ""
    counterexample: dict[str, Any] | None = None
    claim: str = ""

    @property
    def ok(self) -> bool:
        """True when the status is the expected one."""
        return self.status == self.expected

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"ok": self.ok}


# ---------------------------------------------------------------------------------------------------- registry
@dataclass
class Context:
    """What a check runs with: the reference (seam), the scope switch, and a progress callback."""

    ref: Reference
    quick: bool = False
    progress: Callable[[int, int, str], None] = field(default=lambda done, total, note: None)

    def cases(self, items: Iterable[Any], total: int | None = None, note: str = "") -> Iterable[Any]:
        """Iterate ``items`` and report progress after each."""
        items = list(items) if total is None else items
        total = len(items) if total is None else total  # type: ignore[arg-type]
        for done, item in enumerate(items, 1):
            yield item
            self.progress(done, total, note)


@dataclass(frozen=True)
class CheckSpec:
    name: str
    func: Callable[[Context], Outcome]
    claim: str
    expected: str
    docs: str
    weight: float = 1.0  # relative run time: worker processes start the heaviest checks first


REGISTRY: dict[str, CheckSpec] = {}


def check(name: str, *, claim: str, expected: str = "proved", docs: str = "", weight: float = 1.0) -> Callable:
    """Register a check under ``name`` (``family/part``). ``claim`` states what it establishes; ``expected`` is the
    status the project expects (``refuted`` for a deliberately wrong variant); ``docs`` the page deriving it;
    ``weight`` its relative run time (parallel runs start the heaviest first)."""
    if expected not in STATUSES:
        raise ValueError(f"expected = {expected!r} is not one of {STATUSES}")

    def register(func: Callable[[Context], Outcome]) -> Callable[[Context], Outcome]:
        if name in REGISTRY:
            raise ValueError(f"check {name!r} registered twice")
        REGISTRY[name] = CheckSpec(name=name, func=func, claim=claim, expected=expected, docs=docs, weight=weight)
        return func

    return register


def _load_checks() -> None:
    """Import the modules that register checks."""
    # registry order (the order `lumotree prove` lists and runs them): the GDN core, its solve, every tree size, the
    # index arithmetic, the layers, the code around them, verification
    from . import gdn_checks, solve_checks, induction_checks, index_checks  # noqa: F401, I001
    from . import kernel_checks, kernel_index_checks  # noqa: F401, I001
    from . import layer_checks, conformance_checks, verify_checks, lossless_symbolic  # noqa: F401, I001


def select_checks(only: str | None = None) -> list[CheckSpec]:
    """Every registered check, or those named ``only`` or in family ``only`` (``closed-form`` selects
    ``closed-form/*``). Raises ``ValueError`` naming the unknown selection."""
    _load_checks()
    specs = list(REGISTRY.values())
    if only is None:
        return specs
    chosen = [s for s in specs if s.name == only or s.name.startswith(only.rstrip("/") + "/")]
    if not chosen:
        raise ValueError(f"--only {only!r} matches no check; known: {', '.join(REGISTRY)}")
    return chosen


def run_check(
    name: str,
    *,
    ref: Reference | None = None,
    quick: bool = False,
    progress: Callable[[int, int, str], None] | None = None,
) -> CheckResult:
    """Run one registered check against ``ref`` (default: the project's reference)."""
    _load_checks()
    if name not in REGISTRY:
        raise ValueError(f"no check named {name!r}; known: {', '.join(REGISTRY)}")
    spec = REGISTRY[name]
    ctx = Context(ref=ref if ref is not None else default_reference(), quick=quick)
    if progress is not None:
        ctx.progress = progress
    start = time.perf_counter()
    try:
        outcome = spec.func(ctx)
    except Unavailable as err:
        outcome = Outcome("unknown", {}, detail=str(err))
    except Exception as err:  # the reference (or a substituted one) raised on a valid input
        tb = traceback.extract_tb(err.__traceback__)[-1]
        outcome = Outcome(
            "unknown", {}, detail=f"raised {type(err).__name__}: {err} (at {tb.filename}:{tb.lineno})"
        )
    return CheckResult(
        name=name,
        status=outcome.status,
        scope=outcome.scope,
        seconds=round(time.perf_counter() - start, 3),
        expected=spec.expected,
        detail=outcome.detail,
        counterexample=outcome.counterexample,
        claim=spec.claim,
    )


def run_checks(
    only: str | None = None,
    *,
    ref: Reference | None = None,
    quick: bool = False,
    jobs: int = 1,
    on_start: Callable[[int, int, CheckSpec], None] | None = None,
    on_progress: Callable[[int, int, str], None] | None = None,
    on_result: Callable[[CheckResult], None] | None = None,
) -> list[CheckResult]:
    """Run the selected checks; results in registry order. The callbacks drive a progress display.

    ``jobs > 1`` runs checks in that many worker processes (fork; the project's reference only, so ``ref`` must be
    None); then ``on_start`` / ``on_progress`` are not called and ``on_result`` sees results as they complete.
    """
    specs = select_checks(only)
    if jobs > 1 and len(specs) > 1:
        if ref is not None:
            raise ValueError("jobs > 1 runs the project's reference in worker processes; pass ref=None")
        return _run_parallel(specs, quick, jobs, on_result)
    results = []
    for index, spec in enumerate(specs, 1):
        if on_start is not None:
            on_start(index, len(specs), spec)
        result = run_check(spec.name, ref=ref, quick=quick, progress=on_progress)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


def _run_parallel(
    specs: list[CheckSpec], quick: bool, jobs: int, on_result: Callable[[CheckResult], None] | None
) -> list[CheckResult]:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    by_name: dict[str, CheckResult] = {}
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        heaviest_first = sorted(specs, key=lambda spec: -spec.weight)
        futures = [pool.submit(run_check, spec.name, quick=quick) for spec in heaviest_first]
        for future in as_completed(futures):
            result = future.result()
            by_name[result.name] = result
            if on_result is not None:
                on_result(result)
    return [by_name[spec.name] for spec in specs]
