"""Parity-conditioned retrieval: the task, a hybrid construction, checked claims, lower bounds, learned separation.

Submodules are imported on first use (``lumotree.expressivity.task`` etc.) so that importing the package stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_SUBMODULES = {"task", "hybrid", "proof", "scratchpad", "adversary", "learned", "cli"}

__all__ = sorted(_SUBMODULES)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
