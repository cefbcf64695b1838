"""Exact reference: token trees, Gated DeltaNet, gated attention, the hybrid model, tree verification.

Everything here is slow, readable and exact. The GDN core runs unchanged on float64 arrays and on object arrays of
``fractions.Fraction``, sympy expressions and z3 real terms. This package never imports triton.
"""

from __future__ import annotations

import importlib
from typing import Any

from .tree import TokenTree

_SUBMODULES = {
    "tree", "gdn", "attention", "model", "config", "checkpoint", "verify", "speculate", "numerics", "demo", "drafters",
    "solve",
}

__all__ = ["TokenTree", *sorted(_SUBMODULES)]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
