"""Machine-checked claims about the reference, run on the reference functions themselves.

Every check runs the project's own code (``lumotree.reference``) on sympy polynomials / rational functions, Z3 terms,
or exact rationals, through the :class:`~lumotree.proofs.core.Reference` seam, so a subtly wrong implementation
substituted there makes the matching check come out ``refuted`` with a counterexample. ``lumotree prove`` runs them.

- :mod:`~lumotree.proofs.gdn_checks`: closed form = recurrence, factor commit, chain = chunk, nilpotent solve.
- :mod:`~lumotree.proofs.layer_checks`: short convolution and attention on trees, conv-state / KV compaction.
- :mod:`~lumotree.proofs.index_checks`: ancestor-word and path-position arithmetic of the kernels (Z3).
- :mod:`~lumotree.proofs.verify_checks`: lossless tree verification (three variants, exact enumeration) and greedy.
"""

from __future__ import annotations

from .core import (
    REGISTRY,
    STATUSES,
    CheckResult,
    CheckSpec,
    Context,
    Outcome,
    Reference,
    check,
    default_reference,
    run_check,
    run_checks,
    select_checks,
)

__all__ = [
    "REGISTRY",
    "STATUSES",
    "CheckResult",
    "CheckSpec",
    "Context",
    "Outcome",
    "Reference",
    "check",
    "default_reference",
    "run_check",
    "run_checks",
    "select_checks",
]
