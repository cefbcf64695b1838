"""The optimized hybrid model: :class:`OptimizedModel` (the API, :mod:`~lumotree.optimized.model.model`), its
weights, caches (sized by :mod:`~lumotree.optimized.model.memory`), layers, small kernels and CUDA graphs, the MTP
head (:mod:`~lumotree.optimized.model.mtp`), and the
builders below."""

from __future__ import annotations

import os
from typing import Any

import torch

from .loader import LoadReport, ProgressBar, default_dtype, load_checkpoint
from .memory import MemoryPlan, plan_memory
from .model import HEAD_ROWS, OptimizedModel
from .mtp import MTPHead
from .presets import RANDOM_CONFIGS
from .weights import random_tensors, random_weights, select_layers, successor_permutation

__all__ = ["OptimizedModel", "MTPHead", "MemoryPlan", "plan_memory", "load_pretrained", "load_checkpoint",
           "LoadReport", "ProgressBar", "from_reference", "build_random", "random_tensors", "random_weights",
           "select_layers", "successor_permutation", "RANDOM_CONFIGS", "HEAD_ROWS"]


def load_pretrained(path: str | os.PathLike, progress: Any = None, **kwargs: Any) -> OptimizedModel:
    """An :class:`OptimizedModel` from a HF checkpoint directory of any supported model type, streamed tensor by
    tensor to the device (:func:`~lumotree.optimized.model.loader.load_checkpoint`; ``progress``: its callback, e.g.
    :class:`~lumotree.optimized.model.loader.ProgressBar`). ``kwargs`` go to :class:`OptimizedModel` (``device``
    and ``dtype`` also choose where and how the weights load)."""
    device = torch.device(kwargs.get("device") or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = kwargs.get("dtype") or default_dtype(device)
    config, weights, _ = load_checkpoint(path, device, dtype, progress)
    return OptimizedModel(config, weights, **{**kwargs, "device": device, "dtype": dtype})


def from_reference(model: Any, **kwargs: Any) -> OptimizedModel:
    """The optimized model with the weights of a :class:`lumotree.reference.model.HybridModel`."""
    from lumotree.reference.model import weights_to_tensors

    return OptimizedModel(model.config, weights_to_tensors(model.weights, model.config), **kwargs)


def build_random(config: Any, seed: int = 0, **kwargs: Any) -> OptimizedModel:
    """A seeded random model generated directly on the target device
    (:func:`~lumotree.optimized.model.weights.random_tensors`): for large benchmark models."""
    device = torch.device(kwargs.get("device") or ("cuda" if torch.cuda.is_available() else "cpu"))
    return OptimizedModel(config, random_tensors(config, seed, device), **kwargs)
