"""HF-format checkpoint directories: ``config.json`` plus safetensors, one file or sharded.

A directory holds either ``model.safetensors`` or ``model.safetensors.index.json`` (``{"weight_map": {name: file}}``)
with the shards it names. Tensors are read through torch (so bfloat16 checkpoints load) and returned as float64 numpy
arrays. This module knows files, not models: the tensor names and shapes of the hybrid model live in
:mod:`lumotree.reference.model`. ``safetensors`` is imported on use (it is a test/extra dependency).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

__all__ = ["read_config", "read_json", "read_tensors", "write_checkpoint", "SINGLE_FILE", "INDEX_FILE", "CONFIG_FILE"]

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

_DTYPES = ("float64", "float32", "bfloat16", "float16")


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


def read_tensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint at ``path`` as a float64 numpy array, by HF name."""
    from safetensors import safe_open

    path = Path(path)
    weight_map = _shard_map(path)
    files = sorted(set(weight_map.values())) if weight_map else [SINGLE_FILE]
    tensors: dict[str, np.ndarray] = {}
    for name in files:
        file = path / name
        if not file.is_file():
            raise FileNotFoundError(f"shard {name!r} named in {INDEX_FILE} is missing from {str(path)!r}")
        try:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():
                    if weight_map and weight_map.get(key) != name:
                        raise ValueError(f"tensor {key!r} sits in shard {name!r} but {INDEX_FILE} maps it elsewhere")
                    tensors[key] = f.get_tensor(key).double().numpy()
        except ValueError:
            raise
        except Exception as exc:  # safetensors' own errors (a truncated or garbage file) name no file
            raise ValueError(f"{file}: not a readable safetensors file ({str(exc).splitlines()[0][:120]})") from None
    for key, name in weight_map.items():
        if key not in tensors:
            raise ValueError(f"tensor {key!r} is listed in {INDEX_FILE} (shard {name!r}) but not stored there")
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
    Shards are named ``model-00001-of-0000K.safetensors`` as transformers names them.
    """
    import torch
    from safetensors.torch import save_file

    if dtype not in _DTYPES:
        raise ValueError(f"dtype = {dtype!r} is not one of {_DTYPES}")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    torch_dtype = getattr(torch, dtype)
    stored = {name: torch.from_numpy(np.ascontiguousarray(t, dtype=np.float64)).to(torch_dtype).contiguous()
              for name, t in tensors.items()}
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
