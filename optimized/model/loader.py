"""Streaming checkpoint loader: safetensors shards read one tensor at a time, straight to the device in the serving
dtype, converted to the kernels' layouts layer by layer.

Order of work: the shards' headers (:func:`lumotree.reference.checkpoint.tensor_table`: names, dtypes, shapes, the index
against its shards, truncated files), the config and the layout (:func:`lumotree.reference.layouts.resolve_checkpoint`:
unknown model types and keys, ``quantization_config``), the tensor table against the model's (missing, unexpected,
wrong-shaped or non-float tensors) and the kernels' size limits are all checked before any tensor data is read (a
block-FP8 checkpoint's float8 weights and their ``weight_scale_inv`` scales included, :mod:`lumotree.reference.fp8`): a
malformed checkpoint ends in one ``ValueError`` naming the key or tensor with nothing on the device. Then each tensor is
read with ``safe_open(...).get_tensor(name)`` in its stored dtype (the only host copy), moved to the device, cast there
to the serving dtype (norms and gates fp32), checked finite, and combined with the other tensors of its layer
(:func:`~lumotree.optimized.model.weights.build_weights`); block-FP8 weights stay float8 on the device with their
float32 scales (:class:`~lumotree.optimized.ops.gemv.Fp8Weight`), never upcast. Host memory: one stored tensor at a time
(the shards are memory-mapped: pages of the file cache, not the process's memory); device memory: the weights plus one
layer's parts. A non-finite tensor found midway frees everything read so far before the error propagates. The vision
tower of a Qwen3.5 checkpoint (``model.visual.*``) is not read.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch

from .weights import ModelWeights, build_weights, check_kernel_limits, finite

__all__ = ["load_checkpoint", "LoadReport", "ProgressBar", "default_dtype"]

#: ``progress(bytes read, bytes in all, tensor name)``, called after each tensor
Progress = Callable[[int, int, str], None]

_ITEM_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1}


@dataclass
class LoadReport:
    """What a load read: the ``layout`` (:class:`lumotree.reference.layouts.CheckpointLayout`), ``tensors`` and
    ``bytes`` read, the stored tensors ``skipped`` (a vision tower), the ``seconds`` it took."""

    layout: Any
    tensors: int = 0
    bytes: int = 0
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0


def default_dtype(device: torch.device) -> torch.dtype:
    """The serving dtype: bf16 on a GPU, fp32 on the CPU (the interpreter's tests)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_checkpoint(path: str | os.PathLike, device: str | torch.device | None = None,
                    dtype: torch.dtype | None = None, progress: Progress | None = None,
                    part: tuple[int, int] = (0, 1)) -> tuple[Any, ModelWeights, LoadReport]:
    """``(config, weights, report)`` of the checkpoint directory ``path`` of any supported model type, its weights
    on ``device`` (default: CUDA when present) in ``dtype`` (default :func:`default_dtype`) in the kernels' layouts,
    the MTP head's included (module docstring for the order of work and the memory it takes). ``part = (rank,
    tensor_parallel)``: only that rank's part of each layer is kept, cut as the layer arrives
    (:func:`~lumotree.optimized.parallel.layer_part`), so the device holds the part plus one whole layer."""
    from safetensors import safe_open

    from lumotree.reference.checkpoint import read_config, tensor_table
    from lumotree.reference.layouts import resolve_checkpoint

    start = time.perf_counter()
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = dtype or default_dtype(device)
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"dtype = {dtype} must be float32, bfloat16 or float16")
    path = Path(path)
    table = tensor_table(path)
    config, layout = resolve_checkpoint(read_config(path), table)
    names = layout.check(config, table)
    check_kernel_limits(config)
    total = sum(table[name].numel * _ITEM_BYTES[table[name].dtype] for name in names)
    report = LoadReport(layout, skipped=sorted(name for name in table if layout.skips(name)))
    with ExitStack() as files:
        handles: dict[str, Any] = {}

        def fetch(name: str, as_dtype: torch.dtype | None) -> torch.Tensor:
            info = table[name]
            if info.file not in handles:
                handles[info.file] = files.enter_context(safe_open(str(path / info.file), framework="pt"))
            host = handles[info.file].get_tensor(name)  # the stored dtype, on the host: the only host copy
            t = host.to(device)
            del host
            t = t.to(as_dtype or dtype)  # cast on the device (block-FP8 weights are asked for in float8: kept)
            if not finite(t):
                raise ValueError(f"tensor {name!r} contains NaN or inf")
            report.tensors += 1
            report.bytes += info.numel * _ITEM_BYTES[info.dtype]
            if progress is not None:
                progress(report.bytes, total, name)
            return t

        try:
            if part[1] > 1:  # the parallel package imports this one: here
                from ..parallel.shard import layer_part, shard_weights

                weights = shard_weights(build_weights(config, layout, fetch, set(names), device, dtype,
                                                      layer_part(config, *part)), config, *part, layers_done=True)
            else:
                weights = build_weights(config, layout, fetch, set(names), device, dtype)
        except BaseException as exc:  # nothing half-loaded: drop the frames' references, return the memory
            traceback.clear_frames(exc.__traceback__)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            raise
    report.seconds = time.perf_counter() - start
    return config, weights, report


class ProgressBar:
    """A one-line loading bar on ``stream`` (default stderr): GB read of GB, tensors, rate; ended by a newline when
    the last byte is read. Redrawn at most every ``interval`` seconds."""

    def __init__(self, stream: TextIO | None = None, interval: float = 0.1, width: int = 28):
        self.stream, self.interval, self.width = stream or sys.stderr, interval, width
        self.start = time.perf_counter()
        self.last = -interval
        self.count = 0

    def __call__(self, done: int, total: int, name: str) -> None:
        self.count += 1
        now = time.perf_counter()
        final = done >= total
        if not final and now - self.last < self.interval:
            return
        self.last = now
        filled = int(self.width * done / max(total, 1))
        rate = done / max(now - self.start, 1e-9) / 1e9
        self.stream.write(f"\rloading weights [{'#' * filled}{'.' * (self.width - filled)}] {done / 1e9:.2f}/"
                          f"{total / 1e9:.2f} GB  {self.count} tensors  {rate:.2f} GB/s")
        if final:
            self.stream.write("\n")
        self.stream.flush()
