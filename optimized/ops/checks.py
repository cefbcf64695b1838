"""Input validation shared by every op of :mod:`lumotree.optimized.ops`: each check runs before any launch and names the
argument.

Cheap checks (types, shapes, dtypes, devices, strides) always run. Data checks (tree structure, slot ranges, finite
values, gate ranges) read the tensors back to the host: they run when ``validate=True`` (the default) and are switched
off by callers that validated the same step's inputs once already (inside CUDA-graph capture, say).
"""

from __future__ import annotations

import os
from numbers import Integral

import torch

from lumotree.reference.tree import validate_parents

__all__ = [
    "MAX_NODES",
    "FLOAT_DTYPES",
    "interpreting",
    "check_tensor",
    "check_device",
    "check_finite_nodes",
    "check_range_nodes",
    "check_tree_rows",
    "check_num_nodes",
    "check_slots",
    "check_node_index",
    "node_mask",
    "check_scalar",
    "tma_possible",
    "num_sms",
    "check_rank",
    "check_finite",
    "check_kv_cache",
    "check_cache_slots",
    "check_lens_fit",
    "check_slot_range",
]

MAX_NODES = 128  # the largest tree (nodes per request) the kernels are built for
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


_NUM_SMS: dict[int, int] = {}


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA ``device`` (cached); 4 elsewhere (the interpreter's launch heuristics)."""
    if device.type != "cuda":
        return 4
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _NUM_SMS:
        _NUM_SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _NUM_SMS[idx]


def tma_possible(*tensors: torch.Tensor) -> bool:
    """Whether tensor descriptors can address ``tensors``: a Hopper-or-later GPU (or the interpreter), 16-byte aligned
    bases and strides (the last dim contiguous), every dimension's indices within int32."""
    if not interpreting() and not all(t.is_cuda and torch.cuda.get_device_capability(t.device)[0] >= 9
                                      for t in tensors):
        return False
    return all(t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and max(t.shape) < 2**31
               and all((st * t.element_size()) % 16 == 0 for st in t.stride()[:-1]) for t in tensors)


def check_device(name: str, t: torch.Tensor, device: torch.device) -> None:
    """Every input on one device; CUDA unless the Triton interpreter runs the kernels."""
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but the other inputs are on {device}")
    if device.type != "cuda" and not interpreting():
        raise ValueError(f"{name} is on {device}; the Triton kernels need CUDA tensors (or TRITON_INTERPRET=1)")


def check_tensor(
    name: str,
    t: object,
    shape: tuple[int | None, ...],
    dims: str,
    dtypes: tuple[torch.dtype, ...],
    device: torch.device,
    *,
    last_contiguous: bool = True,
    contiguous: bool = False,
) -> torch.Tensor:
    """Type, shape (None = any), dtype, device and layout of one tensor argument; returns it."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.ndim != len(shape) or any(e is not None and s != e for s, e in zip(t.shape, shape)):
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected [{dims}] = {tuple(shape)}")
    if t.dtype not in dtypes:
        names = [str(d).removeprefix("torch.") for d in dtypes]
        raise TypeError(f"{name} has dtype {t.dtype}, expected one of {names}")
    check_device(name, t, device)
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (strides {t.stride()})")
    if last_contiguous and t.ndim and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension (strides {t.stride()})")
    return t


def node_mask(num_nodes: torch.Tensor, N: int) -> torch.Tensor:
    """``[B, N]`` bool: node i of request b is real (``i < num_nodes[b]``), not padding."""
    return torch.arange(N, device=num_nodes.device)[None, :] < num_nodes[:, None].to(torch.int64)


def check_finite_nodes(name: str, t: torch.Tensor, real: torch.Tensor | None) -> None:
    """NaN/inf policy: real nodes' inputs must be finite (padding rows are never read by the kernels).

    ``t: [B, N, ...]``, ``real: [B, N]`` bool or None (check everything).
    """
    bad = ~torch.isfinite(t)
    if real is not None:
        bad = bad & real.reshape(real.shape + (1,) * (t.ndim - 2))
    if bool(bad.any()):
        idx = torch.nonzero(bad)[0].tolist()
        raise ValueError(f"{name}{idx} = {t[tuple(idx)].item()} is not finite (NaN/inf inputs are rejected)")


def check_range_nodes(name: str, t: torch.Tensor, low: float, high: float, real: torch.Tensor) -> None:
    """Real nodes' values must lie in ``[low, high]`` (the reference's gate ranges; NaN lies in none)."""
    bad = ~((t >= low) & (t <= high)) & real.reshape(real.shape + (1,) * (t.ndim - 2))
    if bool(bad.any()):
        idx = torch.nonzero(bad)[0].tolist()
        raise ValueError(f"{name}{idx} = {t[tuple(idx)].item()} is outside [{low}, {high}]")


def check_num_nodes(num_nodes: object, B: int, N: int, device: torch.device, validate: bool) -> torch.Tensor:
    """``num_nodes: [B]`` integer tensor (None = every tree has N nodes); returns it as int32 on ``device``."""
    if num_nodes is None:
        return torch.full((B,), N, dtype=torch.int32, device=device)
    if not isinstance(num_nodes, torch.Tensor):
        raise TypeError(f"num_nodes must be a torch.Tensor or None, got {type(num_nodes).__name__}")
    if num_nodes.shape != (B,) or num_nodes.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"num_nodes must be an int32/int64 tensor of shape [B] = ({B},), got "
                         f"{num_nodes.dtype} {tuple(num_nodes.shape)}")
    check_device("num_nodes", num_nodes, device)
    if validate:
        bad = (num_nodes < 1) | (num_nodes > N)
        if bool(bad.any()):
            b = int(torch.nonzero(bad)[0])
            raise ValueError(f"num_nodes[{b}] = {int(num_nodes[b])} is outside [1, N = {N}]")
    return num_nodes.to(torch.int32)


def check_sizes(num_nodes: object, B: int, N: int, device: torch.device, validate: bool) -> torch.Tensor | None:
    """:func:`check_num_nodes` for kernels that read no sizes when none are given (``HAS_NUM`` = the caller gave
    ``num_nodes``): None when ``num_nodes`` is None and nothing is validated (every tree has N nodes, and no tensor
    is made), else the checked int32 tensor (a full one, for the host-side validation only, when none was given)."""
    if num_nodes is None and not validate:
        return None
    return check_num_nodes(num_nodes, B, N, device, validate)


def check_tree_rows(parents: torch.Tensor, num_nodes: torch.Tensor | None = None, name: str = "parents") -> None:
    """Each request's real nodes form a tree in topological order: ``parents[b, 0] == -1`` and
    ``0 <= parents[b, i] < i`` for ``i < num_nodes[b]`` (padding entries are ignored; every node is real when
    ``num_nodes`` is None). One host copy; the message of the first bad row is
    :func:`lumotree.reference.tree.validate_parents`'."""
    if not isinstance(parents, torch.Tensor) or parents.ndim != 2 or parents.shape[1] == 0:
        got = tuple(parents.shape) if isinstance(parents, torch.Tensor) else type(parents).__name__
        raise ValueError(f"{name} must be a [B, N] tensor with N >= 1, got {got}")
    if parents.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} has dtype {parents.dtype}, expected int32 or int64")
    p = parents.to(torch.int64)
    idx = torch.arange(p.shape[1], device=p.device)[None, :]
    ok = torch.where(idx == 0, p == -1, (p >= 0) & (p < idx))  # [B, N]
    if num_nodes is not None:
        ok = ok | ~node_mask(num_nodes, p.shape[1])
    if not bool(ok.all()):
        b = int(torch.nonzero(~ok)[0][0])
        row = p[b, : (int(num_nodes[b]) if num_nodes is not None else p.shape[1])].cpu().tolist()
        validate_parents(row, name=f"{name}[{b}]")  # raises, naming the entry
        raise AssertionError("unreachable: the vectorised and the reference tree checks disagree")


def check_slots(slots: object, B: int, P: int, device: torch.device, validate: bool, *, distinct: bool) -> torch.Tensor:
    """``slots: [B]`` integer indices into a pool of ``P`` entries; ``distinct`` when the kernel writes them."""
    check_tensor("slots", slots, (B,), "B", (torch.int32, torch.int64), device)
    if validate:
        bad = (slots < 0) | (slots >= P)
        if bool(bad.any()):
            b = int(torch.nonzero(bad)[0])
            raise ValueError(f"slots[{b}] = {int(slots[b])} is outside the pool [0, {P})")
        if distinct and B > 1 and torch.unique(slots).numel() != B:
            raise ValueError("slots repeats a slot: two requests would write the same pool entry")
    return slots.to(torch.int32)


def check_node_index(name: str, t: object, B: int, num_nodes: torch.Tensor, device: torch.device,
                     validate: bool) -> torch.Tensor:
    """``t: [B]`` integer node indices, each below its request's ``num_nodes``; returned as given (int32 or int64:
    the kernels read either, so no conversion kernel runs between a verify and a PDL-launched commit)."""
    check_tensor(name, t, (B,), "B", (torch.int32, torch.int64), device)
    if validate:
        bad = (t < 0) | (t >= num_nodes)
        if bool(bad.any()):
            b = int(torch.nonzero(bad)[0])
            raise ValueError(f"{name}[{b}] = {int(t[b])} is not a node of tree {b} (num_nodes = {int(num_nodes[b])})")
    return t


def check_scalar(name: str, x: object) -> float:
    """A finite positive Python/NumPy real scalar."""
    if isinstance(x, bool) or not isinstance(x, (float, Integral)) and not hasattr(x, "__float__"):
        raise TypeError(f"{name} must be a real number, got {type(x).__name__}")
    value = float(x)
    if not (value > 0 and value < float("inf")):
        raise ValueError(f"{name} = {value} must be finite and positive")
    return value


def check_rank(name: str, t: object, ndim: int, dtypes: tuple[torch.dtype, ...], device: torch.device) -> None:
    """Type, rank, dtype and device of one tensor argument (shapes checked by the caller)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} has dtype {t.dtype}, expected one of {[str(d) for d in dtypes]}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but the other inputs are on {device}")


def check_finite(name: str, t: torch.Tensor) -> None:
    """Every entry of ``t`` finite (one host copy)."""
    if not bool(torch.isfinite(t).all()):
        bad = torch.nonzero(~torch.isfinite(t))[0].tolist()
        raise ValueError(f"{name} contains NaN or inf (first at index {bad})")


def check_kv_cache(k_cache: torch.Tensor, v_cache: torch.Tensor, HKV: int, D: int, device: torch.device) -> None:
    """A KV cache pool pair ``[P, HKV, C, D]`` of one dtype, last dimension contiguous."""
    check_rank("k_cache", k_cache, 4, FLOAT_DTYPES, device)
    if not isinstance(v_cache, torch.Tensor) or v_cache.shape != k_cache.shape or v_cache.dtype != k_cache.dtype \
            or v_cache.device != device:
        got = tuple(v_cache.shape) if isinstance(v_cache, torch.Tensor) else type(v_cache).__name__
        raise ValueError(f"v_cache {got} must match k_cache {tuple(k_cache.shape)} in shape/dtype")
    if k_cache.shape[1] != HKV or k_cache.shape[3] != D:
        raise ValueError(f"k_cache has shape {tuple(k_cache.shape)}, expected [P, HKV, C, D] with HKV={HKV}, D={D}")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("k_cache and v_cache must have a contiguous last dimension")


def check_cache_slots(slots: torch.Tensor, cache_lens: torch.Tensor, B: int, device: torch.device) -> None:
    """``slots`` and ``cache_lens``: contiguous int32 ``[B]``."""
    check_rank("slots", slots, 1, (torch.int32,), device)
    check_rank("cache_lens", cache_lens, 1, (torch.int32,), device)
    if slots.shape[0] != B or cache_lens.shape[0] != B:
        raise ValueError(f"slots {tuple(slots.shape)} and cache_lens {tuple(cache_lens.shape)} must be [B] = [{B}]")
    if not slots.is_contiguous() or not cache_lens.is_contiguous():
        raise ValueError("slots and cache_lens must be contiguous")


def check_lens_fit(cache_lens: torch.Tensor, offsets_or_none: torch.Tensor | None, N: int, C: int) -> None:
    """Every committed length non-negative and ``cache_lens[b] + N <= C`` (one host copy)."""
    lens = cache_lens.cpu()
    if bool((lens < 0).any()):
        raise ValueError(f"cache_lens has a negative entry: {lens.tolist()}")
    if bool((lens + N > C).any()):
        b = int(torch.nonzero(lens + N > C)[0, 0])
        raise ValueError(f"cache_lens[{b}] = {int(lens[b])} + N = {N} tokens exceeds the cache capacity C = {C}")
    if offsets_or_none is not None and bool((offsets_or_none.cpu() < 0).any()):
        raise ValueError("offsets has a negative entry")


def check_slot_range(slots: torch.Tensor, P: int) -> None:
    """Distinct slots inside a pool of ``P`` (one host copy)."""
    s = slots.cpu()
    if bool(((s < 0) | (s >= P)).any()):
        b = int(torch.nonzero((s < 0) | (s >= P))[0, 0])
        raise ValueError(f"slots[{b}] = {int(s[b])} is outside the pool [0, {P})")
    if len(set(s.tolist())) != s.numel():
        raise ValueError(f"slots has repeated entries {s.tolist()}: each request needs its own slot")
