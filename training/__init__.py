"""Training: the Qwen3.5-text hybrid model in PyTorch autograd (GDN through fla's chunk kernel on the GPU), its
corpus and tokenizer, the trainer and ``lumotree train`` (the organism and drafter heads for a frozen target).

Importing the package imports neither torch nor fla; each submodule is loaded on first use.
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
