"""Memory planning: the slot pools and the step buffers a model will hold, counted before anything is allocated.

After the weights are on the device, :func:`plan_memory` takes the memory left (``free_bytes``) and the requested
``num_slots`` / ``max_seq_len`` (either may be None: as many as fit) and returns a :class:`MemoryPlan`, or raises
one ``ValueError`` line saying what the request needs, what is free, and what would fit. It counts:

- the **slot pools**, exactly: the shapes :meth:`~lumotree.optimized.model.caches.Caches.layout` allocates (GDN and
  conv states, KV at ``max_seq_len + max_nodes`` rows, lengths, pending commits), and the KV pools of the MTP head's
  ``mtp_layers`` attention layers (:mod:`~lumotree.optimized.model.mtp`; counted when the checkpoint has a head, used
  or not, so that the MTP drafter can start on a planned model), those of an EAGLE head's ``eagle_layers`` attention
  layers (:mod:`~lumotree.optimized.engine.eagle`; counted when the caller will draft with one), and the hidden states
  the model keeps for either head;
- the **step buffers** of every step shape the engine runs (:func:`step_shapes`): the tree step's stacked GDN
  projections, conv outputs and factors, the fp32 logits of every node, and the per-layer activations (an
  estimate of the largest transients: residual, normed input, GDN output and gate, attention projections, the MLP's
  or the routed experts' hidden rows). With CUDA graphs every captured shape keeps its own memory pool, so the
  shapes' buffers add up; without graphs only the largest step's buffers are live at once.

``headroom`` (default 10 %) of the free memory is left for the allocator's rounding, the kernels' scratch and the
caching allocator's fragmentation.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .caches import Caches

__all__ = ["BATCH_BUCKETS", "NODE_BUCKETS", "MemoryPlan", "free_memory", "plan_memory", "pool_bytes", "step_bytes",
           "step_shapes"]

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # the engine's batch sizes (and its max batch)
NODE_BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # the engine's tree sizes (and its max nodes)
MAX_SLOTS = 1 << 20
GIB = 1 << 30


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def free_memory(device: torch.device) -> int:
    """Bytes a model may still allocate on ``device``: CUDA's free memory plus what torch's caching allocator holds
    unused; on the host, the kernel's ``MemAvailable``."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def step_shapes(max_batch: int, max_nodes: int, speculative: bool = True) -> list[tuple[int, int]]:
    """The ``(B, N)`` steps an engine of ``max_batch`` requests and ``max_nodes`` nodes runs (its warm-up captures
    each): decode ``(b, 1)`` and, speculating, tree steps ``(b, n)`` for its batch and node buckets."""
    batches = sorted({b for b in BATCH_BUCKETS if b <= max_batch} | {max_batch})
    nodes = sorted({n for n in NODE_BUCKETS if 1 < n <= max_nodes} | ({max_nodes} if max_nodes > 1 else set()))
    return [(b, 1) for b in batches] + ([(b, n) for b in batches for n in nodes] if speculative else [])


def pool_bytes(config: Any, gdn_dims: tuple | None, attn_dims: tuple | None, *, num_slots: int, capacity: int,
               dtype: torch.dtype, deferred: bool = False, mtp_layers: int = 0, eagle_layers: int = 0) -> int:
    """Bytes of every slot pool (:meth:`Caches.layout`) of ``num_slots`` slots of ``capacity`` KV rows, plus the MTP
    head's pools when ``mtp_layers`` > 0 and the EAGLE head's when ``eagle_layers`` > 0 (each head's attention layers'
    KV and lengths, as :class:`~lumotree.optimized.model.mtp.MTPHead` allocates them)."""
    n_gdn = sum(1 for kind in config.layer_types if kind == "linear_attention")
    layouts = [Caches.layout(num_slots, capacity, n_gdn, len(config.layer_types) - n_gdn, gdn_dims, attn_dims, dtype,
                             deferred)]
    for head_layers in (mtp_layers, eagle_layers):
        if head_layers:
            layouts.append(Caches.layout(num_slots, capacity, 0, head_layers, None, attn_dims, dtype, False))
    return sum(_numel(shape) * torch.empty((), dtype=kind).element_size() * count
               for layout in layouts for shape, kind, count in layout.values())


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def step_bytes(config: Any, gdn_dims: tuple | None, attn_dims: tuple | None, B: int, N: int,
               dtype: torch.dtype) -> int:
    """Bytes of one ``[B, N]`` step's buffers (module docstring): exact for the stacked tree buffers and the logits,
    an estimate of the largest per-layer transients."""
    T, size, f32 = B * N, torch.empty((), dtype=dtype).element_size(), 4
    n_gdn = sum(1 for kind in config.layer_types if kind == "linear_attention")
    D, vocab = int(config.hidden_size), int(config.vocab_size)
    total = T * vocab * f32 + T * 8  # fp32 logits of every node, the argmax
    per_row = 3 * D * size  # residual, update, normed input
    if gdn_dims is not None and n_gdn:
        H, HV, K, V, _ = gdn_dims
        C = 2 * H * K + HV * V
        if N > 1:  # the tree step's stacked projections, conv outputs (fp32 when fused) and factors
            total += n_gdn * T * ((C + HV * V + 2 * HV) * size + C * f32 + (HV * V + HV + H) * f32)
        per_row += 3 * HV * V * size + C * f32  # o, gated o, z; the decode step's conv output
    if attn_dims is not None:
        HQ, HKV, Dh = attn_dims
        per_row += (2 * HQ + 2 * HKV) * Dh * size  # q and its gate, k, v
    if config.num_experts:  # the routed experts' hidden rows and the shared expert's
        experts = int(config.num_experts_per_tok) * int(config.moe_intermediate_size)
        per_row += 2 * (experts + int(config.shared_expert_intermediate_size or 0)) * size + config.num_experts * f32
    per_row += 2 * int(config.intermediate_size or 0) * size
    return total + T * per_row


@dataclass(frozen=True)
class MemoryPlan:
    """The planned pools: ``num_slots`` slots of ``max_seq_len`` tokens (``pool_bytes``, ``per_slot_bytes`` each),
    ``step_bytes`` for the step buffers of ``shapes`` (summed with CUDA graphs), out of ``free_bytes``."""

    num_slots: int
    max_seq_len: int
    pool_bytes: int
    per_slot_bytes: int
    step_bytes: int
    free_bytes: int
    headroom: float
    shapes: int

    def summary(self) -> str:
        return (f"{self.num_slots} slots x {self.max_seq_len} tokens: pools {_gib(self.pool_bytes)} "
                f"({self.per_slot_bytes / (1 << 20):.1f} MiB a slot), step buffers {_gib(self.step_bytes)} "
                f"({self.shapes} step shapes), {_gib(self.free_bytes)} free")


def plan_memory(config: Any, gdn_dims: tuple | None, attn_dims: tuple | None, *, free_bytes: int,
                dtype: torch.dtype, num_slots: int | None, max_seq_len: int | None, max_nodes: int,
                graphs: bool, speculative: bool = True, deferred: bool = False,
                headroom: float = 0.1, mtp_layers: int = 0, eagle_layers: int = 0) -> MemoryPlan:
    """The pools for ``num_slots`` x ``max_seq_len`` (one of them None: the most that fit; ``max_seq_len`` at most the config's
    ``max_position_embeddings`` where it has one, and 2^24), checked against ``free_bytes`` less ``headroom``. Raises ``ValueError`` (one line:
    the need, the free memory, what fits) when the request does not fit."""
    if not 0 <= headroom < 1:
        raise ValueError(f"headroom = {headroom!r} must be in [0, 1)")
    budget = int(free_bytes * (1 - headroom))
    context_limit = int(getattr(config, "max_position_embeddings", 0) or 1 << 24)

    def need(slots: int, seq: int) -> tuple[int, int, int]:
        shapes = step_shapes(slots, max_nodes, speculative)
        steps = [step_bytes(config, gdn_dims, attn_dims, b, n, dtype) for b, n in shapes]
        pools = pool_bytes(config, gdn_dims, attn_dims, num_slots=slots, capacity=seq + max_nodes, dtype=dtype,
                           deferred=deferred, mtp_layers=mtp_layers, eagle_layers=eagle_layers)
        if mtp_layers or eagle_layers:  # the hidden states the model keeps for a head: [P, max_nodes + 1, D]
            pools += slots * (max_nodes + 1) * int(config.hidden_size) * torch.empty((), dtype=dtype).element_size()
        return pools, (sum(steps) if graphs else max(steps)), len(shapes)

    def fits(slots: int, seq: int) -> bool:
        pools, steps, _ = need(slots, seq)
        return pools + steps <= budget

    def largest(low: int, high: int, ok) -> int:  # the largest x in [low, high] with ok(x), else low - 1
        if not ok(low):
            return low - 1
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if ok(mid) else (low, mid - 1)
        return low

    if num_slots is None and max_seq_len is None:
        raise ValueError("num_slots and max_seq_len are both None: give one of them (the other is planned)")
    seq, slots = max_seq_len, num_slots
    if seq is None:
        seq = largest(1, context_limit, lambda s: fits(slots, s))
        if seq < 1:
            raise ValueError(_refusal(need(slots, 1), slots, 1, free_bytes, budget, headroom, "no context length "
                                      "fits"))
    if slots is None:
        slots = largest(1, MAX_SLOTS, lambda p: fits(p, seq))
        if slots < 1:
            raise ValueError(_refusal(need(1, seq), 1, seq, free_bytes, budget, headroom,
                                      f"not one slot fits; at most max_seq_len "
                                      f"{largest(1, seq, lambda s: fits(1, s))} with 1 slot"))
    pools, steps, shapes = need(slots, seq)
    if pools + steps > budget:
        more_slots = largest(1, slots, lambda p: fits(p, seq))
        longest = largest(1, seq, lambda s: fits(slots, s))
        hint = []
        if more_slots >= 1:
            hint.append(f"at most {more_slots} slots at max_seq_len {seq}")
        if longest >= 1:
            hint.append(f"max_seq_len {longest} with {slots} slots")
        raise ValueError(_refusal((pools, steps, shapes), slots, seq, free_bytes, budget, headroom,
                                  " or ".join(hint) or "a smaller model or fewer step shapes"))
    per_slot = pool_bytes(config, gdn_dims, attn_dims, num_slots=2, capacity=seq + max_nodes, dtype=dtype,
                          deferred=deferred, mtp_layers=mtp_layers, eagle_layers=eagle_layers) - pool_bytes(
        config, gdn_dims, attn_dims, num_slots=1, capacity=seq + max_nodes, dtype=dtype, deferred=deferred,
        mtp_layers=mtp_layers, eagle_layers=eagle_layers)
    return MemoryPlan(slots, seq, pools, per_slot, steps, free_bytes, headroom, shapes)


def _refusal(need: tuple[int, int, int], slots: int, seq: int, free: int, budget: int, headroom: float,
             fits: str) -> str:
    pools, steps, shapes = need
    return (f"num_slots = {slots} and max_seq_len = {seq} need {_gib(pools)} of cache pools and {_gib(steps)} of "
            f"step buffers ({shapes} step shapes), {_gib(pools + steps)} in all, but {_gib(budget)} is usable "
            f"({_gib(free)} free, {headroom:.0%} kept back): {fits}")
