"""Block FP8 weights: the fine-grained FP8 format of the family's FP8 releases (transformers' ``FP8Linear`` /
``FP8Experts``, ``quantization_config = {"quant_method": "fp8", "weight_block_size": [128, 128]}``).

A quantised linear weight ``W: [..., N, K]`` is stored as ``q: [..., N, K]`` float8_e4m3fn (``F8_E4M3``) plus
``scale_inv: [..., cdiv(N, 128), cdiv(K, 128)]`` float32 named ``<weight>_scale_inv`` (``q_proj.weight`` ->
``q_proj.weight_scale_inv``; a fused expert tensor ``experts.gate_up_proj`` -> ``experts.gate_up_proj_scale_inv``,
whose row blocks are at least 2, as transformers allocates them). The weight it stands for is, per block,

    ``W[..., n, k] = float(q[..., n, k]) * scale_inv[..., n // 128, k // 128]``

which :func:`dequantize_blocks` evaluates exactly in float64 (an e4m3 value has 4 significant bits and a float32
scale 24: the product fits a double's 53). The reference backend runs this dequantised model; the optimized backend
keeps ``q`` and the scales on the device and dequantises in its kernels.

Which tensors may be quantised (:func:`fp8_eligible`): the linear projections (``*proj*.weight``: ``q_proj``,
``in_proj_qkvz``, ``in_proj_b``, ``down_proj``, ...; the MTP head's ``mtp.fc.weight``; fused experts). Each may also
stay float (a release's ``modules_to_not_convert``): the stored dtype decides. The embedding, the LM head, the norms,
the router (``mlp.gate``) and the shared expert's gate stay in their float dtype, as the releases ship them.
:func:`quantize_blocks` is the writer's side (tests and tiny checkpoints): ``scale_inv = amax(|W| over the block) /
448``, ``q = round_e4m3(W / scale_inv)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["FP8_DTYPE", "FP8_MAX", "fp8_eligible", "scale_name", "scale_shape", "dequantize_blocks",
           "quantize_blocks", "quantize_tensors"]

#: the safetensors dtype of a quantised weight
FP8_DTYPE = "F8_E4M3"
#: the largest finite float8_e4m3fn value
FP8_MAX = 448.0
_FUSED = (".experts.gate_up_proj", ".experts.down_proj")


def fp8_eligible(name: str) -> bool:
    """Whether the stored tensor ``name`` is a linear weight a block-FP8 checkpoint may quantise."""
    if name.endswith(_FUSED):
        return True
    parts = name.rsplit(".", 2)
    return name == "mtp.fc.weight" or (len(parts) == 3 and parts[2] == "weight" and "proj" in parts[1])


def scale_name(name: str) -> str:
    """The stored name of the scales of quantised weight ``name``."""
    return name + "_scale_inv"


def scale_shape(name: str, shape: Sequence[int], block: Sequence[int] = (128, 128)) -> tuple[int, ...]:
    """The shape of the scales of quantised weight ``name: shape`` (``[..., N, K]``)."""
    *lead, rows, cols = shape
    row_blocks = math.ceil(rows / block[0])
    if name.endswith(".experts.gate_up_proj"):  # transformers keeps a scale row for each half
        row_blocks = max(row_blocks, 2)
    return (*lead, row_blocks, math.ceil(cols / block[1]))


def dequantize_blocks(q: np.ndarray, scale_inv: np.ndarray, block: Sequence[int] = (128, 128)) -> np.ndarray:
    """``W = q * scale_inv`` per ``block`` (module docstring), exactly, as float64: ``q: [..., N, K]`` (the e4m3
    values), ``scale_inv: [..., >= cdiv(N, b0), cdiv(K, b1)]``."""
    q = np.asarray(q, dtype=np.float64)
    scale = np.asarray(scale_inv, dtype=np.float64)
    rows, cols = q.shape[-2:]
    full = np.repeat(np.repeat(scale, block[0], axis=-2), block[1], axis=-1)[..., :rows, :cols]
    return q * full


def quantize_blocks(w: np.ndarray, block: Sequence[int] = (128, 128), name: str = ""):
    """``(q, scale_inv)`` torch tensors (float8_e4m3fn, float32) of ``w: [..., N, K]`` (module docstring); ``name``
    (a fused ``gate_up_proj``) sizes the scales as :func:`scale_shape`."""
    import torch

    w = np.asarray(w, dtype=np.float64)
    rows, cols = w.shape[-2:]
    shape = scale_shape(name, w.shape, block)
    rb, cb = math.ceil(rows / block[0]), math.ceil(cols / block[1])
    padded = np.zeros((*w.shape[:-2], rb * block[0], cb * block[1]))
    padded[..., :rows, :cols] = w
    tiles = padded.reshape(*w.shape[:-2], rb, block[0], cb, block[1])
    amax = np.abs(tiles).max(axis=(-3, -1))  # [..., rb, cb]
    scale = np.where(amax > 0, amax / FP8_MAX, 1.0).astype(np.float32)
    full = np.ones(shape, dtype=np.float32)
    full[..., :rb, :] = scale
    expanded = np.repeat(np.repeat(scale.astype(np.float64), block[0], axis=-2), block[1], axis=-1)[..., :rows, :cols]
    q = torch.from_numpy(np.clip(w / expanded, -FP8_MAX, FP8_MAX)).to(torch.float8_e4m3fn)
    return q, torch.from_numpy(full)


def quantize_tensors(stored: dict, block: Sequence[int] = (128, 128)) -> dict:
    """A checkpoint's stored tensors (name -> array) with every :func:`fp8_eligible` weight replaced by its block
    FP8 form and its ``_scale_inv`` added (what a block-FP8 checkpoint of the same model stores)."""
    out = {}
    for name, t in stored.items():
        if fp8_eligible(name):
            out[name], out[scale_name(name)] = quantize_blocks(t, block, name)
        else:
            out[name] = t
    return out
