r"""The multi-token-prediction (MTP) head on the optimized kernels, and what the model hands it: the final-normed
hidden states of the tokens each step adds to a slot.

The math is :mod:`lumotree.reference.mtp`'s: a head step at position p reads the target's final-normed hidden state
``h_p`` and the embedding of the next token ``x_{p+1}``::

    u   = fc [ RMSNorm(embed(x_{p+1}); pre_fc_norm_embedding) ; RMSNorm(h_p; pre_fc_norm_hidden) ]   # [Dm]
    u   = the MTP decoder layers on u (gated attention at position p over the head's own KV cache, the MLP or MoE)
    g_p = RMSNorm(u; mtp.norm);   logits_p = g_p @ lm_head^T          (over x_{p+2})

:class:`MTPHead` runs its decoder layers with the model's layer loop (:class:`~lumotree.optimized.model.layers.Layers`:
the same attention, MLP and MoE code and kernels) on its own slot-addressed KV pools
(:class:`~lumotree.optimized.model.caches.Caches` with attention layers only). Its steps are tree steps like the
model's, device tensors only (graph safe; on a CUDA model each shape is captured once and replayed):

- ``extend``: append entries from chains of ``(hidden, token)`` pairs (the K/V of a chain already sit at their
  positions: no compaction);
- ``tree``: every node of a draft tree (node i at position ``lens + depth(i)``), the KV pools untouched past
  ``lens``; returns the nodes' outputs ``g`` and the logits of the requested rows.

:class:`HiddenStates` is the model's side (mixed into :class:`~lumotree.optimized.model.OptimizedModel`): with
``keep_hidden_states(True)`` every tree step keeps its nodes' final-normed hidden states, the commit gathers the
accepted path's into ``hidden_rows[slot, depth]`` (in the commit's graph), a decode writes its row, a prefill keeps
the prompt's; ``hidden_states(slot, count)`` reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..ops.tree_meta import WORD_BITS
from .caches import Caches
from .graphs import GraphCache
from .kernels import step_prologue
from .layers import Layers, Residual, StepBuffers
from .weights import ModelWeights

__all__ = ["MTPHead", "HiddenStates"]


class HiddenStates:
    """The hidden states an :class:`~lumotree.optimized.model.OptimizedModel` hands the MTP head (module
    docstring)."""

    hidden_rows: torch.Tensor | None  # [P, max_nodes + 1, Dm]; row max_nodes: where off-path nodes go
    _prompt_hidden: dict[int, torch.Tensor]  # slot -> [T, Dm] of its prefill, until its next step
    _mtp_head: Any

    def init_hidden_states(self) -> None:
        """No hidden states kept and no head built yet (the model's constructor)."""
        self.hidden_rows = None  # [P, max_nodes + 1, Dm] once kept; row max_nodes: where off-path nodes go
        self._prompt_hidden = {}  # slot -> [T, Dm] of its prefill, until its next step
        self._mtp_head = None

    @property
    def keep_hidden(self) -> bool:
        """Whether steps keep their final-normed hidden states (:meth:`keep_hidden_states`)."""
        return self.hidden_rows is not None

    def keep_hidden_states(self, enabled: bool) -> None:
        """Keep (or stop keeping) the final-normed hidden states of what each step adds to a slot, for
        :meth:`hidden_states`; drops the captured CUDA graphs."""
        if enabled and self.hidden_rows is None:
            self.hidden_rows = torch.zeros((self.num_slots, self.max_nodes + 1, self.config.hidden_size),
                                           dtype=self.dtype, device=self.device)  # [P, max_nodes + 1, Dm]
        elif not enabled:
            self.hidden_rows = None
            self._prompt_hidden.clear()
        self._graphs.clear()

    def hidden_states(self, slot: int, count: int) -> torch.Tensor:
        """``[count, Dm]``: the final-normed hidden states (the LM head's input) of the last ``count`` tokens the
        slot's last prefill, decode or commit added, in position order (a view of the model's buffers: valid until
        the slot's next step). Needs :meth:`keep_hidden_states`."""
        slot = self._check_slot(slot)
        if self.hidden_rows is None:
            raise RuntimeError("hidden_states() needs keep_hidden_states(True) before the steps")
        prompt = self._prompt_hidden.get(slot)
        have = prompt.shape[0] if prompt is not None else self.max_nodes
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= have:
            raise ValueError(f"count = {count!r} must be an integer in [1, {have}]")
        return prompt[-count:] if prompt is not None else self.hidden_rows[slot, :count]

    def mtp_head(self) -> MTPHead:
        """The MTP head on this model's weights (built once; it turns :meth:`keep_hidden_states` on). A model without
        ``mtp.*`` weights raises ``ValueError``."""
        if self._mtp_head is None:
            self._mtp_head = MTPHead(self)
            self.keep_hidden_states(True)
        return self._mtp_head

    def _forget_prompt_hidden(self, host_slots: list[int]) -> None:
        """The slots' next step replaces what :meth:`hidden_states` reads: their prefill's rows are dropped."""
        if self._prompt_hidden:
            for s in host_slots:
                self._prompt_hidden.pop(s, None)

    def _keep_decode_hidden(self, slots: torch.Tensor, x: torch.Tensor) -> None:
        """A decode step's rows ``x: [B, Dm]`` become ``hidden_rows[slots, 0]`` (when kept; graph safe)."""
        if self.hidden_rows is not None:
            self.hidden_rows[:, 0].index_copy_(0, slots.long(), x)

    def _keep_path_hidden(self, rec: Any, accepted: torch.Tensor) -> None:
        """``hidden_rows[slot, d]`` = the hidden state of the accepted path's node of depth d, for a step record
        ``rec`` and its ``accepted [B]`` nodes (device tensors only: graph safe); off-path nodes go to the row
        ``max_nodes``."""
        words = rec.meta.words  # [B, N, W] inclusive ancestor bitsets
        row = words.gather(1, accepted.long()[:, None, None].expand(rec.B, 1, words.shape[-1]))[:, 0]  # [B, W]
        node = torch.arange(rec.N, device=words.device)  # [N]
        on_path = ((row[:, node // WORD_BITS] >> (node % WORD_BITS)) & 1).bool()  # [B, N]
        off_path = self.max_nodes
        depth = torch.where(on_path, rec.meta.depth.long(), off_path)  # [B, N] destination row of each node
        flat = rec.slots.long()[:, None] * (off_path + 1) + depth  # [B, N] rows of hidden_rows as [P (M + 1), Dm]
        self.hidden_rows.view(-1, self.hidden_rows.shape[-1]).index_copy_(
            0, flat.reshape(-1), rec.hidden.reshape(rec.B * rec.N, -1))


class MTPHead(Layers):
    """The MTP head of an :class:`~lumotree.optimized.model.OptimizedModel` (module docstring), sharing its weights,
    with its own KV pools (one slot per model slot, the model's capacity).

    - ``reset(slot)`` / ``release(slot)``: the slot holds no entry;
    - ``extend(slots, tokens, hidden)``: for request b append the pairs ``(hidden[b][t], tokens[b][t])`` at positions
      ``lens[slot] + t``;
    - ``tree(slots [B], tokens [B, N], parents [B, N], num_nodes [B], hidden [B, N, Dm], rows [B, R]) ->
      (g [B, N, Dm], logits [B, R, V] fp32)``: node i reads ``(hidden[b, i], tokens[b, i])``; logits of the nodes
      ``rows[b]``; pools untouched past ``lens``.

    Both pad the batch to a power of two (at most ``num_slots``) with slots outside it, as the model's target pads
    its steps to batch buckets: few shapes, few CUDA graphs however the batch changes. A padding row is a one-node
    tree (or chain) whose K/V land past its slot's length, where every step writes before it reads, and whose length
    stays as it was.
    """

    def __init__(self, model: Any):
        mtp = model.weights.mtp
        if mtp is None:
            raise ValueError("the model has no MTP head (config.mtp_num_hidden_layers = 0: the checkpoint holds no "
                             "mtp.* tensors)")
        self.model = model
        self.mtp = mtp
        self.config, self.device, self.dtype, self.eps = model.config, model.device, model.dtype, model.eps
        self.gdn_precision, self.capacity = model.gdn_precision, model.capacity
        self.num_slots, self.max_nodes = model.num_slots, model.max_nodes
        self.hidden_size = int(model.config.hidden_size)
        w = model.weights
        self.weights = ModelWeights(w.embed, mtp.final_norm, w.lm_head, list(mtp.layers), list(mtp.mlps), None,
                                    w.attn_dims, w.inv_freq)
        self.caches = Caches(model.num_slots, model.capacity, 0, len(mtp.layers), None, w.attn_dims, model.dtype,
                             model.device, False)
        self.lens = self.caches.lens  # [P] entries per slot
        self._graphs = GraphCache(self.device)

    # the projection options follow the model's (Layers reads them)
    @property
    def small_batch_linear(self) -> bool:
        return self.model.small_batch_linear

    @property
    def fused_norms(self) -> bool:
        return self.model.fused_norms

    @property
    def pdl(self) -> bool:
        return self.model.pdl

    @property
    def parallel(self) -> Any:  # tensor parallel: the model's group (its weights are this rank's shard)
        return self.model.parallel

    def reset(self, slot: int) -> None:
        self.lens[self.model._check_slot(slot)] = 0

    release = reset

    def _run(self, key: tuple, inputs: dict[str, torch.Tensor], body) -> Any:
        if self.model.graphs:
            return self._graphs.run(key, inputs, body)
        return body(**{name: t.to(self.device) for name, t in inputs.items()})

    def _pass(self, tokens, slots, parents, num_nodes, hidden):
        """The head on a batch of trees: ``(g [B, N, Dm], slots [B] int32, lens [B], tree metadata)``."""
        B, N = tokens.shape
        e, slots32, lens, meta = step_prologue(tokens, slots, self.weights.embed, self.lens, False,
                                               (parents, num_nodes))  # e: [B N, Dm] the tokens' embeddings
        embedded = self.normed(Residual(e), self.mtp.embed_norm)  # [B N, Dm]
        normed = self.normed(Residual(hidden.reshape(B * N, -1).contiguous()), self.mtp.hidden_norm)  # [B N, Dm]
        res = Residual(self.linear(torch.cat([embedded, normed], -1), self.mtp.fc))  # [B N, Dm] fc on the pair
        self.run_layers(res, StepBuffers(B, N, slots32, lens, meta, parents, num_nodes))
        return self.normed(res, self.weights.final_norm).view(B, N, -1), slots32, lens, meta

    def _extend_body(self, tokens, slots, parents, num_nodes, hidden, advance) -> None:
        _, slots32, lens, _ = self._pass(tokens, slots, parents, num_nodes, hidden)
        self.lens.index_copy_(0, slots32.long(), lens + advance)  # a chain's K/V sit at their positions already

    def _tree_body(self, tokens, slots, parents, num_nodes, hidden, rows):
        g, _, _, _ = self._pass(tokens, slots, parents, num_nodes, hidden)  # [B, N, Dm]
        B, R = rows.shape
        picked = g.gather(1, rows.long()[:, :, None].expand(B, R, g.shape[-1]))  # [B, R, Dm]
        logits = self.head(picked.reshape(B * R, -1))  # [B R, V] fp32
        return g, logits.view(B, R, -1)

    @staticmethod
    def grown_sizes(rounds: int, top_k: int) -> list[int]:
        """Nodes before each round of :meth:`grow` and after the last: round 0 expands the root, every later round
        the ``top_k`` newest nodes of highest path probability, each into ``top_k`` children."""
        sizes = [1]
        for d in range(rounds):
            sizes.append(sizes[-1] + (1 if d == 0 else top_k) * top_k)
        return sizes

    def fitting_rounds(self, rounds: int, top_k: int) -> int:
        """The most rounds, at most ``rounds``, that :meth:`grow` can run: the tree before the last round must fit in
        ``max_nodes`` (0: not even one round)."""
        sizes = self.grown_sizes(rounds, top_k)
        return next((d for d in range(rounds, 0, -1) if sizes[d - 1] <= self.max_nodes), 0)

    def _grow_body(self, tokens, slots, hidden, *, rounds: int, top_k: int):
        """EAGLE-2's growth (chains: ``top_k`` = 1) on the device, no host read between rounds. Round d runs the head
        on the tree so far, padded to a power of two as :meth:`tree` pads it (padding nodes: a chain of token 0; node
        0 reads ``hidden``, node u >= 1 the previous round's output of its parent), and gives each frontier node its
        ``top_k`` most probable children (log-softmax in float64); the new frontier is the ``top_k`` new nodes of
        highest path log-probability (ties: the older node). ``tokens: [B]`` the pending tokens; returns the trees
        ``(tokens [B, n] int64, parents [B, n] int64, path log-probabilities [B, n] float64)``."""
        B, dev = tokens.shape[0], tokens.device
        sizes = self.grown_sizes(rounds, top_k)
        n_all = sizes[-1]
        ids = torch.zeros((B, n_all), dtype=torch.int64, device=dev)  # [B, n]
        ids[:, 0] = tokens
        par = (torch.arange(n_all, dtype=torch.int64, device=dev) - 1)[None].repeat(B, 1)  # [B, n] real nodes set below
        logp = torch.zeros((B, n_all), dtype=torch.float64, device=dev)  # [B, n]
        frontier = torch.zeros((B, 1), dtype=torch.int64, device=dev)  # [B, F]
        outputs = None  # [B, W_prev, Dm]
        for d in range(rounds):
            n, F = sizes[d], frontier.shape[1]
            W = min(self.max_nodes, 1 << (n - 1).bit_length())
            chain = torch.arange(W, dtype=torch.int64, device=dev) - 1  # [W] padding nodes: a chain
            node_tokens = torch.zeros((B, W), dtype=torch.int64, device=dev)  # [B, W]
            node_tokens[:, :n] = ids[:, :n]
            parents = chain[None].repeat(B, 1)  # [B, W]
            parents[:, :n] = par[:, :n]
            node_hidden = hidden[:, None, :].expand(B, W, hidden.shape[-1]).contiguous()  # [B, W, Dm]
            if outputs is not None:  # node u >= 1 reads its parent's output
                index = parents[:, 1:].clamp(0, outputs.shape[1] - 1)  # [B, W - 1]
                node_hidden[:, 1:] = outputs.gather(1, index[:, :, None].expand(-1, -1, outputs.shape[-1]))
            num_nodes = torch.full((B,), n, dtype=torch.int32, device=dev)
            outputs, logits = self._tree_body(node_tokens, slots, parents.to(torch.int32), num_nodes, node_hidden,
                                              frontier)  # [B, W, Dm], [B, F, V]
            top = torch.log_softmax(logits.double(), -1).topk(top_k, dim=-1)  # [B, F, k]
            fresh = slice(n, n + F * top_k)  # children in (frontier node, rank) order
            ids[:, fresh] = top.indices.reshape(B, -1)
            par[:, fresh] = frontier[:, :, None].expand(B, F, top_k).reshape(B, -1)
            logp[:, fresh] = (logp.gather(1, frontier)[:, :, None] + top.values).reshape(B, -1)
            order = torch.sort(-logp[:, fresh], dim=1, stable=True).indices  # [B, F k] best first, older on ties
            frontier = order[:, :top_k] + n
        return ids, par, logp

    def grow(self, slots: torch.Tensor, tokens: torch.Tensor, hidden: torch.Tensor, rounds: int, top_k: int
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Greedy draft trees (chains: ``top_k`` = 1) of ``rounds`` rounds from the pending ``tokens [B]`` whose
        node 0 reads ``hidden [B, Dm]``, every round in one call (one CUDA graph per batch bucket, rounds and
        ``top_k``; :meth:`_grow_body`): ``(tokens, parents, path log-probabilities)``, each ``[B, n]`` with
        ``n = grown_sizes(rounds, top_k)[-1]`` — the trees that ``rounds`` calls of :meth:`tree` grow. The pools are
        untouched past ``lens``."""
        B = int(tokens.shape[0])
        host = self._check_batch(slots, B)
        if rounds < 1 or top_k < 1 or self.fitting_rounds(rounds, top_k) < rounds:
            raise ValueError(f"rounds = {rounds}, top_k = {top_k}: the head runs trees of at most {self.max_nodes} "
                             "nodes")
        if tuple(hidden.shape) != (B, self.hidden_size):
            raise ValueError(f"hidden has shape {tuple(hidden.shape)}, expected {(B, self.hidden_size)}")
        pad = self._padding_slots(host)  # padding rows: trees of their own, past their slots' lengths
        inputs = {"tokens": self._pad(tokens.to(torch.int64), len(pad)),
                  "slots": torch.tensor(host + pad, dtype=torch.int32),
                  "hidden": self._pad(hidden.to(self.dtype), len(pad))}
        out = self._run(("grow", B + len(pad), rounds, top_k), inputs,
                        lambda **kw: self._grow_body(rounds=rounds, top_k=top_k, **kw))
        return tuple(t[:B] for t in out)

    def _check_batch(self, slots: torch.Tensor, B: int) -> list[int]:
        host = [int(s) for s in slots.tolist()]
        if len(host) != B or len(set(host)) != B or not all(0 <= s < self.num_slots for s in host):
            raise ValueError(f"slots = {host} must be {B} distinct slot indices in [0, {self.num_slots})")
        return host

    def _padding_slots(self, host: list[int]) -> list[int]:
        """Slots outside the batch ``host`` that pad it to the next power of two (none past ``num_slots``)."""
        bucket = min(self.num_slots, 1 << (len(host) - 1).bit_length())
        taken = set(host)
        return [s for s in range(self.num_slots) if s not in taken][: bucket - len(host)]

    @staticmethod
    def _pad(t: torch.Tensor, extra: int, fill: torch.Tensor | float = 0) -> torch.Tensor:
        """``t`` with ``extra`` rows appended along dim 0 (``fill``: one row, broadcast)."""
        if not extra:
            return t
        rows = torch.empty((extra, *t.shape[1:]), dtype=t.dtype, device=t.device)
        rows[:] = fill
        return torch.cat([t, rows])

    def extend(self, slots: Sequence[int], tokens: Sequence[Sequence[int]], hidden: Sequence[torch.Tensor]) -> None:
        """Append ``len(tokens[b])`` entries to slot ``slots[b]`` from the pairs ``(hidden[b][t] [Dm], tokens[b][t])``,
        in chains of up to ``max_nodes`` (requests batched, widths padded to powers of two)."""
        if not len(slots) == len(tokens) == len(hidden):
            raise ValueError(f"slots, tokens and hidden hold {len(slots)}, {len(tokens)} and {len(hidden)} requests")
        for b, (t, h) in enumerate(zip(tokens, hidden)):
            if tuple(h.shape) != (len(t), self.hidden_size):
                raise ValueError(f"hidden[{b}] has shape {tuple(h.shape)}, expected {(len(t), self.hidden_size)}")
        done = [0] * len(tokens)
        while True:
            todo = [b for b in range(len(tokens)) if done[b] < len(tokens[b])]
            if not todo:
                return
            counts = [min(self.max_nodes, len(tokens[b]) - done[b]) for b in todo]
            width = min(self.max_nodes, 1 << (max(counts) - 1).bit_length())
            ids = torch.zeros((len(todo), width), dtype=torch.int64)  # [B, T] on the host
            pairs = torch.zeros((len(todo), width, self.hidden_size), dtype=self.dtype,
                                device=self.device)  # [B, T, Dm]
            for i, (b, n) in enumerate(zip(todo, counts)):
                ids[i, :n] = torch.tensor(tokens[b][done[b] : done[b] + n], dtype=torch.int64)
                pairs[i, :n] = hidden[b][done[b] : done[b] + n]
                done[b] += n
            host = self._check_batch(torch.tensor([slots[b] for b in todo]), len(todo))
            pad = self._padding_slots(host)  # padding rows: one-node chains that do not advance
            B = len(todo) + len(pad)
            parents = (torch.arange(width, dtype=torch.int32) - 1)[None].expand(B, width).contiguous()  # [B, T]
            inputs = {"tokens": self._pad(ids, len(pad)), "slots": torch.tensor(host + pad, dtype=torch.int32),
                      "parents": parents, "num_nodes": torch.tensor(counts + [1] * len(pad), dtype=torch.int32),
                      "hidden": self._pad(pairs, len(pad)),
                      "advance": torch.tensor(counts + [0] * len(pad), dtype=torch.int32)}
            self._run(("extend", B, width), inputs, self._extend_body)

    def tree(self, slots: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, num_nodes: torch.Tensor,
             hidden: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every node of a batch of draft trees (class docstring): ``(g [B, N, Dm], logits [B, R, V] fp32)``. Under
        CUDA graphs both are the graph's static outputs: valid until the next call of the same shape."""
        B, N = tokens.shape
        host = self._check_batch(slots, B)
        if not 1 <= N <= self.max_nodes:
            raise ValueError(f"tokens has N = {N} nodes; the head takes 1 <= N <= {self.max_nodes}")
        if tuple(hidden.shape) != (B, N, self.hidden_size):
            raise ValueError(f"hidden has shape {tuple(hidden.shape)}, expected {(B, N, self.hidden_size)}")
        if rows.ndim != 2 or rows.shape[0] != B or bool(((rows < 0) | (rows >= N)).any()):
            raise ValueError(f"rows must be a [B, R] tensor of node indices in [0, {N})")
        pad = self._padding_slots(host)  # padding rows: one-node trees
        chain = torch.arange(N, dtype=torch.int32, device=parents.device) - 1  # [N] a valid tree for padding rows
        inputs = {"tokens": self._pad(tokens.to(torch.int64), len(pad)),
                  "slots": torch.tensor(host + pad, dtype=torch.int32),
                  "parents": self._pad(parents.to(torch.int32), len(pad), chain),
                  "num_nodes": self._pad(num_nodes.to(torch.int32), len(pad), 1),
                  "hidden": self._pad(hidden.to(self.dtype), len(pad)),
                  "rows": self._pad(rows.to(torch.int64), len(pad))}
        g, logits = self._run(("tree", B + len(pad), N, rows.shape[1]), inputs, self._tree_body)
        return g[:B], logits[:B]
