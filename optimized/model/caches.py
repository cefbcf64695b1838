"""The model's per-request caches, addressed by slot: one tensor per kind of pool with a leading layer dimension.

- GDN layers: recurrent state ``[G, P, HV, K, V]`` fp32 and conv state ``[G, P, W - 1, C]`` fp32;
- attention layers: KV cache ``[A, P, HKV, capacity, D]`` (capacity = ``max_seq_len + max_nodes``: a tree's K / V
  are written right after the committed ones, then compacted);
- the committed length of each slot ``[P]`` int32 (all layers advance together);
- with deferred commits (the fused GDN verify, sm_90): per GDN layer the
  :class:`~lumotree.optimized.ops.gdn_tree.PendingCommits` of every slot, and on the host the slots that may hold
  one (``deferred``): any reader of their states other than the fused verify flushes them first.

One tensor per kind lets a commit advance every layer in one launch; the per-layer lists are views of them.
"""

from __future__ import annotations

import torch

from ..ops.gdn_tree import PendingCommits, gdn_tree_flush, pending_commits, pending_layout

__all__ = ["Caches"]


class Caches:
    """Slot-addressed pools of one model (see the module docstring)."""

    def __init__(self, num_slots: int, capacity: int, gdn_layers: int, attention_layers: int,
                 gdn_dims: tuple[int, int, int, int, int] | None, attn_dims: tuple[int, int, int] | None,
                 dtype: torch.dtype, device: torch.device, deferred_commits: bool):
        layout = self.layout(num_slots, capacity, gdn_layers, attention_layers, gdn_dims, attn_dims, dtype, False)

        def zeros(name: str) -> torch.Tensor:
            shape, kind, _ = layout[name]
            return torch.zeros(shape, dtype=kind, device=device)

        self.state_stack = zeros("state_stack")  # [G, P, HV, K, V] fp32
        self.conv_stack = zeros("conv_stack")  # [G, P, W - 1, C] fp32
        self.k_stack = zeros("k_stack")  # [A, P, HKV, cap, D]
        self.v_stack = zeros("v_stack")  # [A, P, HKV, cap, D]
        self.state_pools: list[torch.Tensor] = list(self.state_stack.unbind(0))  # per GDN layer [P, HV, K, V]
        self.conv_pools: list[torch.Tensor] = list(self.conv_stack.unbind(0))  # per GDN layer [P, W - 1, C]
        self.k_pools: list[torch.Tensor] = list(self.k_stack.unbind(0))  # per attention layer [P, HKV, cap, D]
        self.v_pools: list[torch.Tensor] = list(self.v_stack.unbind(0))
        self.lens = zeros("lens")  # [P] committed length per slot
        self.root_words = zeros("root_words") + 1  # [P, 1, 1] decode: a one-node tree's bitset
        self.zero_offsets = zeros("zero_offsets")  # [P, 1] decode: RoPE at position lens
        self.key_heads = gdn_dims[0] if gdn_dims is not None else 1
        self.pending: list[PendingCommits] | None = None
        self.deferred: set[int] = set()  # slots whose pending commits may be active
        self.set_deferred(deferred_commits)

    @staticmethod
    def layout(num_slots: int, capacity: int, gdn_layers: int, attention_layers: int,
               gdn_dims: tuple[int, int, int, int, int] | None, attn_dims: tuple[int, int, int] | None,
               dtype: torch.dtype, deferred_commits: bool) -> dict[str, tuple[tuple[int, ...], torch.dtype, int]]:
        """``name -> (shape, dtype, count)`` of every tensor the pools hold (``count`` tensors of that shape: the
        pending commits, one per GDN layer), as :class:`Caches` allocates them; a model without GDN or attention
        layers keeps empty pools of unit dims."""
        P, f32, i32 = num_slots, torch.float32, torch.int32
        H, HV, K, V, W = gdn_dims if gdn_dims is not None else (1, 1, 1, 1, 2)
        _, HKV, D = attn_dims if attn_dims is not None else (1, 1, 1)
        out = dict(state_stack=((gdn_layers, P, HV, K, V), f32, 1),
                   conv_stack=((gdn_layers, P, W - 1, 2 * H * K + HV * V), f32, 1),
                   k_stack=((attention_layers, P, HKV, capacity, D), dtype, 1),
                   v_stack=((attention_layers, P, HKV, capacity, D), dtype, 1),
                   lens=((P,), i32, 1), root_words=((P, 1, 1), i32, 1), zero_offsets=((P, 1), i32, 1))
        if deferred_commits and gdn_layers:
            out.update({f"pending.{name}": (shape, kind, gdn_layers)
                        for name, (shape, kind) in pending_layout(P, H, HV, K, V).items()})
        return out

    def set_deferred(self, enabled: bool) -> None:
        """Hold per-slot pending commits (allocated here) or none; nothing may be pending when switched off."""
        assert not self.deferred, "flush the deferred slots first"
        self.pending = ([pending_commits(pool, self.key_heads) for pool in self.state_pools]
                        if enabled and self.state_pools else None)

    def reset(self, slot: int) -> None:
        """Zero one slot's recurrent and conv states and drop what is pending for it (a new request)."""
        self.state_stack[:, slot].zero_()
        self.conv_stack[:, slot].zero_()
        if self.pending is not None:
            for pending in self.pending:
                pending.active[slot].zero_()
        self.deferred.discard(slot)

    def flush(self, slots: list[int]) -> None:
        """Apply the pending commits of ``slots`` (those that may hold one) to the states, every GDN layer."""
        todo = [s for s in slots if s in self.deferred]
        if not todo or self.pending is None:
            return
        index = torch.tensor(todo, dtype=torch.int32, device=self.state_stack.device)  # [S]
        for pending, pool in zip(self.pending, self.state_pools):
            gdn_tree_flush(pending, pool, index, validate=False)
        self.deferred.difference_update(todo)

    def read_kv(self, slot: int, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of ``slot``'s K / V rows of positions ``[start, end)``: ``[A, HKV, end - start, D]`` each."""
        return (self.k_stack[:, slot, :, start:end].clone(),  # [A, HKV, n, D]
                self.v_stack[:, slot, :, start:end].clone())

    def read_state(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of ``slot``'s recurrent and conv states (its deferred commits applied first): ``[G, HV, K, V]``,
        ``[G, W - 1, C]``."""
        self.flush([slot])
        return self.state_stack[:, slot].clone(), self.conv_stack[:, slot].clone()

    def write(self, slot: int, kv: list[tuple[int, int, tuple[torch.Tensor, torch.Tensor]]],
              state: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Put K / V rows (``(start, end, (k, v))`` as :meth:`read_kv` returns them) and states (as
        :meth:`read_state` returns them) in ``slot``, which holds nothing pending afterwards."""
        self.reset(slot)
        for start, end, (k, v) in kv:
            self.k_stack[:, slot, :, start:end] = k
            self.v_stack[:, slot, :, start:end] = v
        self.state_stack[:, slot] = state[0]
        self.conv_stack[:, slot] = state[1]
