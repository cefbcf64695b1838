"""The GDN tree op's shared types and argument checks: the factors a verify leaves for its commit, the output gate
the verify may fuse, the precision modes."""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..checks import (FLOAT_DTYPES, MAX_NODES, check_node_index, check_sizes, check_slots, check_tensor,
                      check_tree_rows, tma_possible)
from ..tree_meta import check_meta, tree_metadata

__all__ = ["TreeFactors", "OutputGate", "GATE_PIECE", "PRECISIONS", "check_factors", "check_commit_tree",
           "check_precision", "pow2_dim", "tma_descriptors"]

GATE_PIECE = 16  # columns per piece of the output's sums of squares (OutputGate.parts)
PRECISIONS = ("ieee", "tf32x3", "tf32")


class TreeFactors(NamedTuple):
    """Token-level factors of a verified batch of trees: all a commit needs besides ``S0``.

    ``delta: [B, N, HV, V]`` solved update vectors, fp32 (fp16 from the fused verify: the values its outputs
    used); ``log_gamma: [B, N, HV]`` fp32 ``log Gamma_i`` (path sum of g); ``k: [B, N, H, K]`` the keys as passed to
    verify (a reference, not a copy); ``k_rnorm: [B, N, H]`` fp32 ``rsqrt(|k_i|^2 + 1e-6)`` when verify normalised
    k in the kernel, else None. The keys used are ``k * k_rnorm[..., None]``. Padding nodes hold zeros.
    """

    delta: torch.Tensor
    log_gamma: torch.Tensor
    k: torch.Tensor
    k_rnorm: torch.Tensor | None


class OutputGate(NamedTuple):
    """The gated RMSNorm after a GDN layer, ``weight * o * rsqrt(mean(o^2) + eps) * silu(z)`` per (node, value
    head), half done by the verify kernel: with ``z: [B, N, HV, V]`` (the output gate; strided views with a
    contiguous last dim), ``weight: [V]`` and ``parts: [B, N, HV, V // GATE_PIECE]`` fp32 contiguous (written), the
    kernel stores ``o' = round(weight * round(o) * silu(z))`` in place of ``o`` (zeros on padding nodes) and, in
    ``parts``, the sums of squares of ``round(o)`` in pieces (``parts.sum(-1)`` = each head's sum of squares; how
    the kernel's V blocks share it out over the :data:`GATE_PIECE`-column slots is theirs). The norm is then
    ``o' * rsqrt(sum(parts) / V + eps)``: the next projection applies that factor per head to its product
    (:class:`~lumotree.optimized.ops.gemv.RowNorm` with ``parts`` viewed as ``[B N, HV, V // GATE_PIECE]``), so the
    separate norm launch goes. ``round(o)`` is what the norm would read from the stored output; the rounding of
    the result moves from after the factor to before it (the same relative size)."""

    z: torch.Tensor
    weight: torch.Tensor
    parts: torch.Tensor



def check_factors(factors: object, lead: tuple[int, ...], HV: int, K: int, V: int,
                  device: torch.device) -> tuple:
    """A verify's :class:`TreeFactors` for a pool of ``HV`` value heads of ``[K, V]`` states (``lead``: leading
    layer dimensions): ``(delta, log_gamma, k, k_rnorm, B, N, H)``."""
    if not isinstance(factors, TreeFactors):
        raise TypeError(f"factors must be the TreeFactors returned by gdn_tree_verify, got {type(factors).__name__}")
    delta, log_gamma, k, k_rnorm = factors
    named = "G, " * len(lead)
    check_tensor("factors.delta", delta, (*lead, None, None, HV, V), named + "B, N, HV, V",
                 (torch.float32, torch.float16), device)
    B, N = delta.shape[-4:-2]
    check_tensor("factors.log_gamma", log_gamma, (*lead, B, N, HV), named + "B, N, HV", (torch.float32,), device)
    check_tensor("factors.k", k, (*lead, B, N, None, K), named + "B, N, H, K", FLOAT_DTYPES, device)
    H = k.shape[-2]
    if HV % H != 0:
        raise ValueError(f"state_pool has HV = {HV} value heads, not a multiple of H = {H} (factors.k)")
    if k_rnorm is not None:
        check_tensor("factors.k_rnorm", k_rnorm, (*lead, B, N, H), named + "B, N, H", (torch.float32,), device)
    return delta, log_gamma, k, k_rnorm, B, N, H


def check_commit_tree(parents: object, slots: object, num_nodes: object, accepted: object, meta: object, B: int,
                      N: int, P: int, device: torch.device, validate: bool) -> tuple:
    """A commit's trees (``parents [B, N]``), distinct ``slots`` into a pool of ``P``, sizes, accepted nodes (None:
    none to check, as for a verify that writes the pool) and metadata (built when None): ``(slots, num_nodes,
    accepted, meta, has_num)``; ``has_num``: sizes were given (else every tree has N nodes and the kernels read no
    sizes)."""
    check_tensor("parents", parents, (B, N), "B, N", (torch.int32, torch.int64), device)
    if N > MAX_NODES:
        raise ValueError(f"parents has N = {N} nodes per request; the kernels support at most {MAX_NODES}")
    slots = check_slots(slots, B, P, device, validate, distinct=True)
    has_num = num_nodes is not None
    num_nodes = check_sizes(num_nodes, B, N, device, validate)
    if accepted is not None:
        accepted = check_node_index("accepted", accepted, B, num_nodes, device, validate)
    if meta is not None:
        meta = check_meta(meta, B, N, device)
    if validate:
        check_tree_rows(parents, num_nodes)
    if meta is None:
        meta = tree_metadata(parents, num_nodes=num_nodes if has_num else None, validate=False)
    return slots, num_nodes, accepted, meta, has_num


def pow2_dim(name: str, value: int) -> None:
    if value < 16 or value > 256 or value & (value - 1):
        raise ValueError(f"{name} = {value}: the kernels need a power of two in [16, 256]")


def check_precision(input_precision: object) -> str:
    if input_precision not in PRECISIONS:
        raise ValueError(f"input_precision = {input_precision!r}, expected one of {PRECISIONS}")
    return str(input_precision)


def tma_descriptors(tensors: dict, blocks: dict, enabled: bool = True) -> dict:
    """Host-built tensor descriptors (``name_desc``: zero padding past the edges) of ``tensors[name]`` with block
    ``blocks[name]``, or all None when not ``enabled`` (the config asks for pointers) or when one of them cannot be
    addressed so (:func:`~lumotree.optimized.ops.checks.tma_possible`)."""
    if not enabled or not tma_possible(*tensors.values()):
        return {f"{name}_desc": None for name in tensors}
    from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: PLC0415 - only where TMA is used

    return {f"{name}_desc": TensorDescriptor(t, list(t.shape), list(t.stride()), list(blocks[name]))
            for name, t in tensors.items()}
