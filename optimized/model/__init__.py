"""The optimized hybrid model: :class:`OptimizedModel` (the API, :mod:`~lumotree.optimized.model.model`), its
weights, caches, layers, small kernels and CUDA graphs, and the builders below."""

from __future__ import annotations

import os
from typing import Any

import torch

from .model import HEAD_ROWS, OptimizedModel
from .presets import RANDOM_CONFIGS
from .weights import random_tensors, successor_permutation

__all__ = ["OptimizedModel", "load_pretrained", "from_reference", "build_random", "random_tensors",
           "successor_permutation", "RANDOM_CONFIGS", "HEAD_ROWS"]


def load_pretrained(path: str | os.PathLike, **kwargs: Any) -> OptimizedModel:
    """An :class:`OptimizedModel` from a HF ``Qwen3NextForCausalLM`` checkpoint directory (the reference's reader:
    config keys and tensors are validated the same way). ``kwargs`` go to :class:`OptimizedModel`."""
    from lumotree.reference.checkpoint import read_config, read_tensors
    from lumotree.reference.config import HybridConfig

    config = HybridConfig.from_dict(read_config(path))
    return OptimizedModel(config, read_tensors(path), **kwargs)


def from_reference(model: Any, **kwargs: Any) -> OptimizedModel:
    """The optimized model with the weights of a :class:`lumotree.reference.model.HybridModel`."""
    from lumotree.reference.model import weights_to_tensors

    return OptimizedModel(model.config, weights_to_tensors(model.weights, model.config), **kwargs)


def build_random(config: Any, seed: int = 0, **kwargs: Any) -> OptimizedModel:
    """A seeded random model generated directly on the target device
    (:func:`~lumotree.optimized.model.weights.random_tensors`): for large benchmark models."""
    device = torch.device(kwargs.get("device") or ("cuda" if torch.cuda.is_available() else "cpu"))
    return OptimizedModel(config, random_tensors(config, seed, device), **kwargs)
