"""Parity-conditioned retrieval: the tasks (single-token keys, string keys), hybrid constructions, checked claims,
lower bounds, learned separation.

Submodules are imported on first use (``lumotree.expressivity.task`` etc.) so that importing the package stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_SUBMODULES = {"task", "hybrid", "proof", "scratchpad", "adversary", "learned", "cli", "check", "string_task",
               "string_hybrid", "string_proof", "string_memory", "lower_bound", "separation"}

__all__ = sorted(_SUBMODULES)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
