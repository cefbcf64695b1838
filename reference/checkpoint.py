"""HF-format checkpoint directories: ``config.json`` plus safetensors, one file or sharded.

A directory holds either ``model.safetensors`` or ``model.safetensors.index.json`` (``{"weight_map": {name: file}}``)
with the shards it names. :func:`tensor_table` reads every shard's header only (names, dtypes, shapes; a truncated or
garbage file, a missing shard or an index that disagrees with its shards raise ``ValueError`` / ``FileNotFoundError``
naming the file or tensor). :func:`read_tensors` reads tensors through torch (so bfloat16 checkpoints load) into
float64 numpy arrays: the exact reference's path, for small models. This module knows files, not models: the tensor
names and shapes of the hybrid model live in :mod:`lumotree.reference.weights` and
:mod:`lumotree.reference.layouts`. ``safetensors`` is imported on use (it is a test/extra dependency).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

import numpy as np

__all__ = ["read_config", "read_json", "read_tensors", "tensor_table", "TensorInfo", "write_checkpoint", "SINGLE_FILE",
           "INDEX_FILE", "CONFIG_FILE", "FLOAT_DTYPES"]

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

_DTYPES = ("float64", "float32", "bfloat16", "float16")
#: safetensors dtypes of the tensors lumotree loads (block FP8 weights, ``F8_E4M3``, besides: :mod:`.fp8`)
FLOAT_DTYPES = ("F64", "F32", "BF16", "F16")


class TensorInfo(NamedTuple):
    """One stored tensor: the ``file`` (shard) it sits in, its safetensors ``dtype`` (``"BF16"``, ...) and ``shape``."""

    file: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def read_json(file: Path) -> dict:
    """A JSON object from ``file``; malformed JSON, an empty file or another type raise ``ValueError`` naming the
    file (and the line and column of the first error)."""
    text = file.read_text()
    if not text.strip():
        raise ValueError(f"{file} is empty")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{file}:{exc.lineno}:{exc.colno}: not valid JSON ({exc.msg})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{file}: expected a JSON object, got {type(value).__name__}")
    return value


def read_config(path: str | os.PathLike) -> dict:
    """The ``config.json`` dict of a checkpoint directory."""
    if not Path(path).is_dir():
        raise FileNotFoundError(f"checkpoint {str(path)!r} is not a directory")
    file = Path(path) / CONFIG_FILE
    if not file.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} has no {CONFIG_FILE}")
    return read_json(file)


def _shard_map(path: Path) -> dict[str, str]:
    index = path / INDEX_FILE
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ValueError(f"{index} has no 'weight_map' dict of tensor name -> shard file")
        return weight_map
    if (path / SINGLE_FILE).is_file():
        return {}
    raise FileNotFoundError(f"checkpoint {str(path)!r} has neither {SINGLE_FILE} nor {INDEX_FILE}")


def _open_error(file: Path, exc: Exception) -> ValueError:
    """safetensors' own errors (a truncated or garbage file) name no file: one line that does."""
    return ValueError(f"{file}: not a readable safetensors file ({str(exc).splitlines()[0][:120]})")


def tensor_table(path: str | os.PathLike) -> dict[str, TensorInfo]:
    """Every tensor of the checkpoint at ``path`` from the shards' headers (no tensor data is read), by HF name."""
    from safetensors import safe_open

    path = Path(path)
    weight_map = _shard_map(path)
    files = sorted(set(weight_map.values())) if weight_map else [SINGLE_FILE]
    table: dict[str, TensorInfo] = {}
    for name in files:
        file = path / name
        if not file.is_file():
            raise FileNotFoundError(f"shard {name!r} named in {INDEX_FILE} is missing from {str(path)!r}")
        try:
            with safe_open(str(file), framework="pt") as f:
                views = {key: f.get_slice(key) for key in f.keys()}
                headers = {key: (view.get_dtype(), view.get_shape()) for key, view in views.items()}
        except Exception as exc:
            raise _open_error(file, exc) from None
        for key, (dtype, shape) in headers.items():
            if weight_map and weight_map.get(key) != name:
                raise ValueError(f"tensor {key!r} sits in shard {name!r} but {INDEX_FILE} maps it elsewhere")
            table[key] = TensorInfo(name, str(dtype), tuple(int(d) for d in shape))
    for key, name in weight_map.items():
        if key not in table:
            raise ValueError(f"tensor {key!r} is listed in {INDEX_FILE} (shard {name!r}) but not stored there")
    return table


def read_tensors(path: str | os.PathLike, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """The tensors ``names`` (default: every tensor) of the checkpoint at ``path`` as float64 numpy arrays, by HF
    name. Meant for the exact reference on small models: every tensor is held on the host in float64."""
    from safetensors import safe_open

    path = Path(path)
    table = tensor_table(path)
    wanted = sorted(table) if names is None else sorted(set(names))
    for key in wanted:
        if key not in table:
            raise ValueError(f"checkpoint {str(path)!r} has no tensor {key!r}")
        if table[key].dtype not in (*FLOAT_DTYPES, "F8_E4M3"):
            raise ValueError(f"tensor {key!r} has dtype {table[key].dtype}; lumotree loads floating-point tensors "
                             f"({', '.join(FLOAT_DTYPES)})")
    tensors: dict[str, np.ndarray] = {}
    for shard in sorted({table[key].file for key in wanted}):
        file = path / shard
        try:
            with safe_open(str(file), framework="pt") as f:
                for key in wanted:
                    if table[key].file == shard:
                        tensors[key] = f.get_tensor(key).double().numpy()
        except Exception as exc:
            raise _open_error(file, exc) from None
    return tensors


def write_checkpoint(
    path: str | os.PathLike,
    config: Mapping,
    tensors: Mapping[str, np.ndarray],
    dtype: str = "float64",
    max_shard_bytes: int | None = None,
) -> None:
    """Write ``config.json`` and the tensors (one file, or shards of at most ``max_shard_bytes`` with an index).

    ``dtype`` is the stored precision (``float64`` keeps the reference's weights exactly); config.json records it.
    Torch tensors of float8_e4m3fn and float32 ``*_scale_inv`` tensors (block FP8, :mod:`.fp8`) are stored as they
    are. Shards are named ``model-00001-of-0000K.safetensors`` as transformers names them.
    """
    import torch
    from safetensors.torch import save_file

    if dtype not in _DTYPES:
        raise ValueError(f"dtype = {dtype!r} is not one of {_DTYPES}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch_dtype = getattr(torch, dtype)
    def as_stored(name, t):
        if isinstance(t, torch.Tensor) and (t.dtype == torch.float8_e4m3fn or name.endswith("_scale_inv")):
            return t.contiguous()
        return torch.from_numpy(np.ascontiguousarray(t, dtype=np.float64)).to(torch_dtype).contiguous()

    stored = {name: as_stored(name, t) for name, t in tensors.items()}
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(stored):
        nbytes = stored[name].numel() * stored[name].element_size()
        if max_shard_bytes is not None and shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = stored[name]
        size += nbytes
    for stale in (SINGLE_FILE, INDEX_FILE):
        (path / stale).unlink(missing_ok=True)
    metadata = {"format": "pt"}
    if len(shards) == 1:
        save_file(shards[0], str(path / SINGLE_FILE), metadata=metadata)
    else:
        weight_map = {}
        total = 0
        for k, shard in enumerate(shards):
            name = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(path / name), metadata=metadata)
            for key, t in shard.items():
                weight_map[key] = name
                total += t.numel() * t.element_size()
        with open(path / INDEX_FILE, "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
    with open(path / CONFIG_FILE, "w") as f:
        json.dump({**config, "dtype": dtype}, f, indent=2)
