"""The models behind the engine: the :class:`TargetModel` protocol, the exact reference (:class:`ReferenceTarget`)
and the optimized model (:class:`OptimizedTarget`, padded to batch buckets for its CUDA graphs), and the MTP head each
hands out (:class:`ReferenceMTPHead`; the optimized model's :class:`~lumotree.optimized.model.mtp.MTPHead`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from ..model.memory import BATCH_BUCKETS
from .sampling import TreeBatch, VerifyOutcome

__all__ = ["TargetModel", "ReferenceTarget", "OptimizedTarget", "ReferenceMTPHead"]


@runtime_checkable
class TargetModel(Protocol):
    """What the engine needs from a model. Slots index the cache pools; the engine passes ``slots`` and decode
    ``tokens`` as host tensors and ``trees`` as a :class:`~lumotree.optimized.engine.sampling.TreeBatch` on the host
    (node i
    at position ``cache_length + depth(i)``); a model moves what it needs. ``accepted`` may live on either side.

    - ``prefill(slot, tokens) -> [V]``: reset the slot, run ``tokens``, return the logits after the last one.
    - ``decode(slots [B], tokens [B]) -> [B, V]``: one token per slot, caches advance by one.
    - ``verify(slots [B], trees) -> [B, N, V]``: logits of every node; caches untouched.
    - ``commit(slots [B], trees, accepted [B])``: advance every cache along root..accepted of the last ``verify``.
    - ``release(slot)``: the slot is free again.

    Optional: ``speculate_greedy(slots [B], trees) -> VerifyOutcome`` (on the host): ``verify``, greedy acceptance
    (:func:`~lumotree.optimized.engine.sampling.verify_greedy`) and ``commit`` of the accepted nodes in one call. A
    model
    that has it runs a greedy speculative step with it (fused: fewer launches); without it the engine makes the three
    calls.

    Optional, for the MTP drafter (:class:`~lumotree.optimized.engine.mtp.MTPDrafter`): ``hidden_states(slot, count)
    -> [count, D]``, the final-normed hidden states (the LM head's input) of the last ``count`` tokens the slot's last
    ``prefill`` / ``decode`` / ``commit`` added; ``mtp_head()``, the checkpoint's MTP head, slot-addressed
    (:class:`ReferenceMTPHead` states its protocol; ``ValueError`` without ``mtp.*`` weights).

    Optional, for the prefix cache (:mod:`~lumotree.optimized.engine.prefix_cache`): ``read_kv(slot, start, end)``
    (copies of the K / V rows of positions ``[start, end)``), ``read_state(slot)`` (copies of the GDN and conv
    states), ``restore(slot, kv, state, length)`` (the slot holds ``length`` tokens from them), and
    ``prefill(slot, tokens, start)`` going on after the ``start`` tokens a slot holds.
    """

    vocab_size: int
    max_seq_len: int
    num_slots: int
    max_nodes: int
    device: torch.device

    def prefill(self, slot: int, tokens: Sequence[int]) -> torch.Tensor: ...

    def decode(self, slots: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor: ...

    def verify(self, slots: torch.Tensor, trees: TreeBatch) -> torch.Tensor: ...

    def commit(self, slots: torch.Tensor, trees: TreeBatch, accepted: torch.Tensor) -> None: ...

    def release(self, slot: int) -> None: ...


class ReferenceTarget:
    """The exact reference model (``lumotree.reference.model.HybridModel``, float64, CPU) behind :class:`TargetModel`:
    one reference cache per slot, requests run one after another. Slow and exact: the engine's CPU oracle."""

    def __init__(self, model: Any, num_slots: int = 8, max_seq_len: int = 4096, max_nodes: int = 128):
        from lumotree.reference.attention import KVCache
        from lumotree.reference.model import HybridCache
        from lumotree.reference.tree import TokenTree

        self._TokenTree = TokenTree
        self._KVCache, self._HybridCache = KVCache, HybridCache
        self.model = model
        self.vocab_size = int(model.vocab_size)
        self.num_slots = int(num_slots)
        self.max_seq_len = int(max_seq_len)
        self.max_nodes = int(max_nodes)
        self.device = torch.device("cpu")
        self.caches: dict[int, Any] = {}
        self.passes: dict[int, Any] = {}
        self.hidden: dict[int, np.ndarray] = {}  # slot -> [n, D] hidden states of what its last step added
        self._mtp_head: ReferenceMTPHead | None = None

    def _check_slot(self, slot: int) -> int:
        if not 0 <= int(slot) < self.num_slots:
            raise ValueError(f"slot = {slot} is outside [0, {self.num_slots})")
        return int(slot)

    def prefill(self, slot: int, tokens: Sequence[int], start: int = 0) -> torch.Tensor:
        slot = self._check_slot(slot)
        cache = self.model.new_cache() if start == 0 else self.caches[slot]
        if cache.length != start:
            raise ValueError(f"start = {start}: slot {slot} holds {cache.length} tokens")
        logits, self.hidden[slot] = self.model.forward(list(tokens), cache, return_hidden=True)  # [T, V], [T, D]
        self.caches[slot] = cache
        return torch.from_numpy(np.asarray(logits[-1], dtype=np.float64))

    def read_kv(self, slot: int, start: int, end: int) -> list:
        """Per layer: copies of the attention K / V rows ``[start, end)`` (None for a GDN layer)."""
        return [(layer.keys[start:end].copy(), layer.values[start:end].copy()) if isinstance(layer, self._KVCache)
                else None for layer in self.caches[int(slot)].layers]

    def read_state(self, slot: int) -> list:
        """Per layer: a copy of the GDN layer's conv and recurrent states (None for an attention layer)."""
        return [None if isinstance(layer, self._KVCache) else layer.copy() for layer in self.caches[int(slot)].layers]

    def restore(self, slot: int, kv: list, state: list, length: int) -> None:
        slot = self._check_slot(slot)
        layers = []
        for i, layer_state in enumerate(state):
            if layer_state is not None:
                layers.append(layer_state.copy())
            else:
                keys = np.concatenate([rows[i][0] for _, _, rows in kv])  # [length, Hkv, Dh]
                values = np.concatenate([rows[i][1] for _, _, rows in kv])
                layers.append(self._KVCache(keys, values))
        self.caches[slot] = self._HybridCache(layers, int(length))
        self.passes.pop(slot, None)

    def decode(self, slots: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        rows = []
        for slot, tok in zip(slots.tolist(), tokens.tolist()):
            logits, self.hidden[slot] = self.model.forward([int(tok)], self.caches[self._check_slot(slot)],
                                                           return_hidden=True)  # [1, V], [1, D]
            rows.append(logits[-1])
        return torch.from_numpy(np.stack(rows).astype(np.float64))  # [B, V]

    def _tree(self, trees: TreeBatch, b: int):
        n = int(trees.num_nodes[b])
        return self._TokenTree(trees.parents[b, :n].tolist(), trees.tokens[b, :n].tolist())

    def verify(self, slots: torch.Tensor, trees: TreeBatch) -> torch.Tensor:
        B, N = trees.tokens.shape
        out = torch.zeros((B, N, self.vocab_size), dtype=torch.float64)
        for b, slot in enumerate(slots.tolist()):
            tree = self._tree(trees, b)
            tree_pass = self.model.tree_pass(list(tree.tokens), tree, self.caches[self._check_slot(slot)])
            self.passes[slot] = tree_pass
            out[b, : tree.num_nodes] = torch.from_numpy(np.asarray(tree_pass.logits, dtype=np.float64))
        return out

    def commit(self, slots: torch.Tensor, trees: TreeBatch, accepted: torch.Tensor) -> None:
        for slot, node in zip(slots.tolist(), accepted.tolist()):
            tree_pass = self.passes.pop(slot)
            self.hidden[slot] = tree_pass.hidden[tree_pass.tree.path(int(node))]  # [depth + 1, D] the accepted path
            self.model.commit_pass(tree_pass, int(node), self.caches[slot])

    def release(self, slot: int) -> None:
        self.caches.pop(int(slot), None)
        self.passes.pop(int(slot), None)
        self.hidden.pop(int(slot), None)

    def cache_length(self, slot: int) -> int:
        return int(self.caches[int(slot)].length)

    def hidden_states(self, slot: int, count: int) -> torch.Tensor:
        """``[count, D]`` float64: the final-normed hidden states of the last ``count`` tokens the slot's last step
        added (:class:`TargetModel`)."""
        have = self.hidden[self._check_slot(slot)]
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= have.shape[0]:
            raise ValueError(f"count = {count!r} must be an integer in [1, {have.shape[0]}]")
        return torch.from_numpy(have[-count:])

    def mtp_head(self) -> ReferenceMTPHead:
        """The model's MTP head in float64 (:class:`ReferenceMTPHead`, built once)."""
        if self._mtp_head is None:
            self._mtp_head = ReferenceMTPHead(self.model, self.num_slots, self.max_nodes)
        return self._mtp_head


class ReferenceMTPHead:
    """The exact MTP head (:class:`lumotree.reference.mtp.MTPHead`, float64) behind the slot-addressed protocol the MTP
    drafter drives (the optimized model's :class:`~lumotree.optimized.model.mtp.MTPHead` follows it too): one
    :class:`~lumotree.reference.mtp.MTPCache` per slot, requests one after another.

    - ``reset(slot)`` / ``release(slot)``: the slot holds no entry;
    - ``extend(slots, tokens, hidden)``: append the pairs ``(hidden[b][t] [D], tokens[b][t])`` to slot ``slots[b]``;
    - ``tree(slots [B], tokens [B, N], parents [B, N], num_nodes [B], hidden [B, N, D], rows [B, R]) ->
      (g [B, N, D], logits [B, R, V])``: every node of each draft tree, the caches untouched.
    """

    def __init__(self, model: Any, num_slots: int, max_nodes: int):
        from lumotree.reference.mtp import MTPHead

        self.head = MTPHead(model)  # ValueError without an MTP head
        self.num_slots, self.max_nodes = int(num_slots), int(max_nodes)
        self.hidden_size = int(model.config.hidden_size)
        self.device, self.dtype = torch.device("cpu"), torch.float64
        self.caches: dict[int, Any] = {}

    def reset(self, slot: int) -> None:
        if not 0 <= int(slot) < self.num_slots:
            raise ValueError(f"slot = {slot} is outside [0, {self.num_slots})")
        self.caches[int(slot)] = self.head.new_cache()

    def release(self, slot: int) -> None:
        self.caches.pop(int(slot), None)

    def extend(self, slots: Sequence[int], tokens: Sequence[Sequence[int]], hidden: Sequence[torch.Tensor]) -> None:
        for slot, ids, h in zip(slots, tokens, hidden):
            if len(ids):
                self.head.forward(h.double().numpy(), list(ids), self.caches[int(slot)])

    def tree(self, slots: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, num_nodes: torch.Tensor,
             hidden: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        from lumotree.reference.tree import TokenTree

        B, N = tokens.shape
        g = torch.zeros((B, N, self.hidden_size), dtype=torch.float64)  # [B, N, D]
        logits = torch.zeros((B, rows.shape[1], self.head.model.vocab_size), dtype=torch.float64)  # [B, R, V]
        for b, slot in enumerate(slots.tolist()):
            n = int(num_nodes[b])
            ids = tokens[b, :n].tolist()
            node_logits, node_g = self.head.tree(hidden[b, :n].double().numpy(), ids,
                                                 TokenTree(parents[b, :n].tolist(), ids), self.caches[int(slot)])
            g[b, :n] = torch.from_numpy(node_g)
            logits[b] = torch.from_numpy(node_logits[rows[b].numpy()])
        return g, logits


class OptimizedTarget:
    """:class:`lumotree.optimized.model.OptimizedModel` behind :class:`TargetModel`.

    The model captures one CUDA graph per ``("verify", B, N)``, ``("commit", B, N)`` and ``("decode", B)``; to keep
    that set small while requests come and go, every call is padded to a batch bucket (``batch_buckets``) with free
    slots running a one-node tree whose root is committed; the padding slots' lengths are reset right after (they hold
    no request, and the next ``prefill`` of a slot resets its pools). ``validate=False`` skips the model's own
    argument checks (host syncs) once the engine has validated the trees.
    """

    def __init__(self, model: Any, batch_buckets: Sequence[int] | None = None, validate: bool = True):
        self.model = model
        self.vocab_size = int(model.vocab_size)
        self.num_slots = int(model.num_slots)
        self.max_seq_len = int(model.max_seq_len)
        self.max_nodes = int(model.max_nodes)
        self.device = torch.device(model.device)
        buckets = batch_buckets if batch_buckets is not None else BATCH_BUCKETS
        self.batch_buckets = tuple(sorted({int(b) for b in buckets if b <= self.num_slots} | {self.num_slots}))
        self.validate = bool(validate)
        self.busy: set[int] = set()

    def _padded(self, slots: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        """``slots`` padded to its batch bucket with free slots: ``[Bp]`` int32 on the device, and the pad slots."""
        B = int(slots.shape[0])
        Bp = next(b for b in self.batch_buckets if b >= B)
        host = slots.tolist()
        pad = [s for s in range(self.num_slots) if s not in self.busy and s not in host][: Bp - B]
        if len(pad) < Bp - B:
            raise RuntimeError(f"no free slots to pad a batch of {B} to {Bp}")
        return torch.tensor(host + pad, dtype=torch.int32), pad  # on the host: the model copies it in

    def _reset(self, pad: list[int]) -> None:
        if pad:
            self.model.lens[torch.tensor(pad, dtype=torch.long, device=self.device)] = 0
            for s in pad:
                self.model.release(s)

    def prefill(self, slot: int, tokens: Sequence[int], start: int = 0) -> torch.Tensor:
        logits = self.model.prefill(int(slot), list(tokens), start)
        self.busy.add(int(slot))
        return logits

    def read_kv(self, slot: int, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.caches.read_kv(int(slot), start, end)

    def read_state(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.caches.read_state(int(slot))

    def restore(self, slot: int, kv: list, state: Any, length: int) -> None:
        self.model.restore(int(slot), kv, state, length)
        self.busy.add(int(slot))

    def decode(self, slots: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        B = int(slots.shape[0])
        padded, pad = self._padded(slots)
        tok = tokens  # [Bp] the model copies it in
        if pad:
            tok = torch.zeros(padded.shape[0], dtype=torch.int64, device=tokens.device)
            tok[:B] = tokens
        logits = self.model.decode(padded, tok, validate=self.validate)  # [Bp, V]
        self._reset(pad)
        return logits[:B]

    @staticmethod
    def _padded_trees(trees: TreeBatch, Bp: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``tokens [Bp, N]`` int64, ``parents [Bp, N]`` and ``num_nodes [Bp]`` int32 on the host (the model copies
        them in): the trees, then one-node trees for the padding slots."""
        B, N = trees.tokens.shape
        tokens = np.zeros((Bp, N), dtype=np.int64)  # numpy: a few us a step less than torch's CPU ops
        parents = np.zeros((Bp, N), dtype=np.int32)
        num_nodes = np.ones(Bp, dtype=np.int32)
        parents[:, 0] = -1
        tokens[:B] = trees.tokens.cpu().numpy()
        parents[:B] = trees.parents.cpu().numpy()
        num_nodes[:B] = trees.num_nodes.cpu().numpy()
        return torch.from_numpy(tokens), torch.from_numpy(parents), torch.from_numpy(num_nodes)

    def verify(self, slots: torch.Tensor, trees: TreeBatch) -> torch.Tensor:
        B = int(slots.shape[0])
        padded, pad = self._padded(slots)
        tokens, parents, num_nodes = self._padded_trees(trees, padded.shape[0])
        self._pad_slots = pad
        self._padded_slots = padded
        logits = self.model.verify(padded, tokens, parents, num_nodes, validate=self.validate)  # [Bp, N, V]
        return logits[:B]

    def speculate_greedy(self, slots: torch.Tensor, trees: TreeBatch) -> VerifyOutcome:
        """Verify, greedy acceptance and commit in one model call (:meth:`OptimizedModel.speculate_greedy`: one graph
        replay); the outcome comes back to the host in one copy."""
        B = int(slots.shape[0])
        padded, pad = self._padded(slots)
        tokens, parents, num_nodes = self._padded_trees(trees, padded.shape[0])
        packed = self.model.speculate_greedy(padded, tokens, parents, num_nodes, validate=self.validate)
        outcome = VerifyOutcome.from_packed(packed[:B].cpu())  # [B, 3 + N]: the step's one wait
        self._reset(pad)
        return outcome

    def commit(self, slots: torch.Tensor, trees: TreeBatch, accepted: torch.Tensor) -> None:
        B = int(slots.shape[0])
        acc = torch.zeros(self._padded_slots.shape[0], dtype=torch.int32, device=self.device)
        acc[:B] = accepted
        self.model.commit(self._padded_slots, acc, validate=self.validate)
        self._reset(self._pad_slots)

    def release(self, slot: int) -> None:
        self.busy.discard(int(slot))
        self.model.release(int(slot))

    def hidden_states(self, slot: int, count: int) -> torch.Tensor:
        """The model's :meth:`~lumotree.optimized.model.OptimizedModel.hidden_states` (:class:`TargetModel`)."""
        return self.model.hidden_states(slot, count)

    def mtp_head(self) -> Any:
        """The model's MTP head (:class:`~lumotree.optimized.model.mtp.MTPHead`; hidden states kept from now on)."""
        return self.model.mtp_head()


