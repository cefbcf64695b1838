"""Machine-checked claims about the reference, run on the reference functions themselves.

Every check runs the project's own code (``lumotree.reference``, and the kernels' functions in
:mod:`~lumotree.proofs.kernel_checks`) on sympy polynomials / rational functions, Z3 terms,
or exact rationals (float64 with a stated tolerance where the code itself is float64), through the
:class:`~lumotree.proofs.core.Reference` seam, so a subtly wrong implementation substituted there, or a fault planted in
the reference's source (``tests/faults.py``), makes the matching check come out ``refuted`` with a counterexample.
``lumotree prove`` runs them. Z3 runs under a resource limit, never a clock.

- :mod:`~lumotree.proofs.gdn_checks`: closed form = recurrence, factor commit, deep trees, the GVA head convention.
- :mod:`~lumotree.proofs.solve_checks`: chain = chunk, every solve schedule inverts ``I + A`` (small and deep trees).
- :mod:`~lumotree.proofs.induction_checks`: every tree size (the induction step with block symbols; the doubling for
  any width).
- :mod:`~lumotree.proofs.index_checks`: ancestor words (rows and their fold), positions and slots (Z3), tree structure.
- :mod:`~lumotree.proofs.kernel_checks`: the kernels' own inverse schedules and round counts, run on exact numbers
  (:mod:`~lumotree.proofs.kernel_shim`).
- :mod:`~lumotree.proofs.layer_checks`: short convolution and attention on trees, the model's layer commits.
- :mod:`~lumotree.proofs.conformance_checks`: the float64 layers and model against token-by-token decoding.
- :mod:`~lumotree.proofs.verify_checks`: lossless tree verification (three variants, exact enumeration) and greedy.
- :mod:`~lumotree.proofs.lossless_symbolic`: lossless verification at a node for every distribution (case split).
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
