"""Fast runtime: Triton kernels and the optimized hybrid model (GPU; runs under the Triton interpreter on CPU).

Submodules are imported on first use (``lumotree.optimized.tree_attention`` etc.), so importing the package does not
compile or import triton by itself.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

_SUBMODULES = frozenset(m.name for m in pkgutil.iter_modules(__path__))

__all__ = sorted(_SUBMODULES)


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
