r"""The MTP drafter: the checkpoint's multi-token-prediction head (``mtp.*``) drafts chains and trees from the
target's own hidden states (math: :mod:`lumotree.reference.mtp`).

State per request (slot): the head's KV cache, one entry per target position p from ``(h_p, c_{p+1})`` (``h_p``
the target's final-normed hidden state of context token p), and the *root* hidden state ``h_{L-1}`` of the last
committed token. While the target holds ``c_0 .. c_{L-1}`` and ``c_L`` is pending, the head holds entries
``0 .. L - 2``; every step the target adds tokens ``c_L .. c_{L+a}`` with hidden states ``h_L .. h_{L+a}`` and the
head gains the pairs ``(h_{L-1}, c_L), (h_L, c_{L+1}), .., (h_{L+a-1}, c_{L+a})`` (taken from the target in
``advance``, run through the head at the next ``propose``: decode steps cost the head nothing), and
``h_{L+a}`` becomes the root.

A draft is grown in rounds over one tree per request. Node 0 is the pending token, read by the head as
``(root, c_L)`` at position ``L - 1``; node u of depth d >= 1 reads ``(g_{parent(u)}, t_u)`` at position
``L - 1 + d`` (``g``: the head's normed output, fed back as vLLM's MTP proposer does). Each round runs the head on
the whole tree so far (every node attends to the head's cache and its ancestors) and expands the frontier:

- chains (``chain=True``): the one frontier node gets its argmax child, or with ``sampled=True`` and a sampling
  request a child drawn from the head's distribution under the request's temperature / top-k / top-p (the draft is
  then ``iid`` with that distribution recorded, verified by recursive rejection sampling);
- trees: the ``top_k`` frontier nodes of highest cumulative probability each get their ``top_k`` most probable
  children (EAGLE-2's growth); after ``depth`` rounds the engine keeps the ``max_nodes`` most confident nodes.

On the optimized head a greedy draft whose requests all have room for every round grows in one device call
(:meth:`~lumotree.optimized.model.mtp.MTPHead.grow`), with the same result.

A node's confidence is its path probability under the head's softmax (the product of the head's probabilities of the
tokens from the root to it): in (0, 1], never increasing down a path, what the budget sums.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .drafters import Draft, DraftRequest
from .engine import _DRAFT_STREAM
from .sampling import counter_uniforms, sample_from, target_probs

__all__ = ["MTPDrafter"]


class MTPDrafter:
    """Drafts with the target's MTP head (module docstring). ``target``: a
    :class:`~lumotree.optimized.engine.TargetModel` with ``hidden_states`` and ``mtp_head`` (both targets of the
    engine have them); ``depth``: rounds (the deepest draft token); ``top_k``: children and frontier width of tree
    rounds; ``sampled``: draw the chains of sampling requests from the head instead of taking its argmax."""

    name = "mtp"
    synthetic = False

    def __init__(self, target: Any, depth: int = 3, top_k: int = 2, sampled: bool = False):
        for name, value in (("depth", depth), ("top_k", top_k)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} = {value!r} must be an integer >= 1")
        if not callable(getattr(target, "mtp_head", None)) or not callable(getattr(target, "hidden_states", None)):
            raise TypeError(f"target {type(target).__name__} hands out no MTP head (needs mtp_head() and "
                            "hidden_states(); ReferenceTarget and OptimizedTarget have both)")
        self.target = target
        self.head = target.mtp_head()  # ValueError when the checkpoint has no mtp.* weights
        self.depth, self.top_k, self.sampled = depth, top_k, bool(sampled)
        self.description = (f"the checkpoint's MTP head (mtp.*) on the target's hidden states: depth {depth}, top-k "
                            f"{top_k}{', sampled chains' if sampled else ''}")
        self._root: dict[int, torch.Tensor] = {}  # slot -> [D] hidden state of the last committed token
        self._tokens: dict[int, list[int]] = {}  # slot -> tokens of the pairs not yet run through the head
        self._hidden: dict[int, list[torch.Tensor]] = {}  # slot -> [n, D] pieces of those pairs' hidden states

    # ------------------------------------------------------------------------------------------------ requests
    def admit(self, slot: int, prompt: Sequence[int]) -> None:
        try:
            hidden = self.target.hidden_states(slot, len(prompt)).clone()  # [T, D] the prompt's, after its prefill
        except ValueError:
            raise ValueError(f"the MTP drafter needs the target's hidden states of the whole prompt ({len(prompt)} "
                             "tokens) after its prefill; a prefix-cache hit prefills only the rest: use the MTP "
                             "drafter without a prefix cache") from None
        self.head.reset(slot)
        self._tokens[slot] = [int(t) for t in prompt[1:]]
        self._hidden[slot] = [hidden[:-1]]
        self._root[slot] = hidden[-1]

    def release(self, slot: int) -> None:
        for state in (self._root, self._tokens, self._hidden):
            state.pop(slot, None)
        self.head.release(slot)

    def advance(self, requests: Sequence[DraftRequest], committed: Sequence[Sequence[int]]) -> None:
        if not requests:
            return
        views = [self.target.hidden_states(r.slot, len(new)) for r, new in zip(requests, committed)]  # [n_b, D]
        kept = torch.cat(views).split([len(new) for new in committed])  # one copy for the batch, then its views
        for r, new, hidden in zip(requests, committed, kept):  # hidden: [n, D] of the tokens just committed
            self._tokens[r.slot].extend(int(t) for t in new)
            self._hidden[r.slot] += [self._root[r.slot][None], hidden[:-1]]
            self._root[r.slot] = hidden[-1]

    def _ingest(self, requests: Sequence[DraftRequest]) -> None:
        """Run every request's pending pairs through the head (appended to its cache)."""
        todo = [r.slot for r in requests if self._tokens[r.slot]]
        if todo:
            self.head.extend(todo, [self._tokens[s] for s in todo], [torch.cat(self._hidden[s]) for s in todo])
            for s in todo:
                self._tokens[s], self._hidden[s] = [], []

    def warm_up(self, batch_sizes: Sequence[int]) -> None:
        """Compile and capture the head's step shapes before the first request: ``extend`` at every chunk width and
        the greedy growth of chains and trees (:meth:`~lumotree.optimized.model.mtp.MTPHead.grow`), for every batch
        size in ``batch_sizes`` (on slots ``0 .. B - 1``, which must be free; reset after). A head without these
        steps (the reference's) has nothing to warm."""
        if not callable(getattr(self.head, "grow", None)):
            return
        D, dev = self.head.hidden_size, self.head.device
        widths = sorted({self._width(n) for n in range(1, self.head.max_nodes + 1)})  # extend's chunk widths
        for B in batch_sizes:
            slots = list(range(B))
            for width in widths:  # the first call compiles, the second captures
                for _ in range(2):
                    self.head.extend(slots, [[0] * width] * B, [torch.zeros((width, D), device=dev)] * B)
                    for s in slots:
                        self.head.reset(s)
            for k in sorted({1, self.top_k}):
                rounds = self.head.fitting_rounds(self.depth, k)
                for _ in range(2 if rounds else 0):
                    self.head.grow(torch.tensor(slots, dtype=torch.int32), torch.zeros(B, dtype=torch.int64),
                                   torch.zeros((B, D), device=dev), rounds, k)
        for s in range(max(batch_sizes, default=0)):
            self.head.reset(s)

    # ------------------------------------------------------------------------------------------------ drafts
    def _width(self, nodes: int) -> int:
        """Trees are padded to a power of two (at most the head's limit): few shapes, few graphs."""
        return min(self.head.max_nodes, 1 << max(0, nodes - 1).bit_length())

    def _run(self, requests, tokens, parents, outputs, frontier) -> tuple[torch.Tensor, torch.Tensor]:
        """One round: the head on every request's tree; ``(g [B, W, D], logits [B, F, V])`` of the frontier rows.
        ``outputs [B, n, D]``: the head's outputs of the nodes run before (their children read them)."""
        B, W, dev = len(requests), self._width(max(len(t) for t in tokens)), self.head.device
        ids = torch.zeros((B, W), dtype=torch.int64)  # [B, W]
        par = (torch.arange(W, dtype=torch.int32) - 1)[None].repeat(B, 1)  # [B, W] padding: a chain
        for b, (t, p) in enumerate(zip(tokens, parents)):
            ids[b, : len(t)] = torch.tensor(t)
            par[b, : len(p)] = torch.tensor(p, dtype=torch.int32)
        root = torch.stack([self._root[r.slot] for r in requests]).to(dev)  # [B, D]
        hidden = root[:, None, :].repeat(1, W, 1)  # [B, W, D]: node 0 reads the root
        if outputs is not None:  # node u >= 1 reads its parent's output
            index = par[:, 1:].clamp(0, outputs.shape[1] - 1).long().to(dev)  # [B, W - 1]
            hidden[:, 1:] = outputs.gather(1, index[:, :, None].expand(-1, -1, outputs.shape[-1]))
        width = max(len(f) for f in frontier)
        rows = torch.tensor([f + [f[0]] * (width - len(f)) for f in frontier])  # [B, F]
        slots = torch.tensor([r.slot for r in requests], dtype=torch.int32)
        num = torch.tensor([len(t) for t in tokens], dtype=torch.int32)
        return self.head.tree(slots, ids, par, num, hidden, rows)

    def propose(self, requests: Sequence[DraftRequest], max_nodes: int, chain: bool) -> list[Draft]:
        if not requests:
            return []
        self._ingest(requests)
        B = len(requests)
        k = 1 if chain else self.top_k
        sampled = self.sampled and chain and any(not r.params.greedy for r in requests)
        limit = self.target.max_seq_len
        rounds = [max(0, min(self.depth, max_nodes - 1, limit - len(r.context))) for r in requests]  # room left
        if not sampled and callable(getattr(self.head, "grow", None)) and len(set(rounds)) == 1 and rounds[0] > 0:
            # as many rounds as the round-by-round growth below runs before a tree past the head's limit
            return self._grown(requests, self.head.fitting_rounds(rounds[0], k), k, max_nodes)
        tokens = [[int(r.context[-1])] for r in requests]
        parents: list[list[int]] = [[-1] for _ in requests]
        logp: list[list[float]] = [[0.0] for _ in requests]  # cumulative log-probability under the head
        frontier: list[list[int]] = [[0] for _ in requests]
        drawn_from: list[list[torch.Tensor]] = [[] for _ in requests]  # sampled chains: node u's distribution
        outputs = None
        if sampled:
            temperature = torch.tensor([float(r.params.temperature) for r in requests], dtype=torch.float64)
            top_k = torch.tensor([int(r.params.top_k) for r in requests], dtype=torch.int64)
            top_p = torch.tensor([float(r.params.top_p) for r in requests], dtype=torch.float64)
            coins = counter_uniforms(torch.tensor([r.seed for r in requests], dtype=torch.int64),
                                     torch.tensor([r.counter for r in requests], dtype=torch.int64),
                                     max(1, max(rounds)), _DRAFT_STREAM)  # [B, rounds] one coin a depth
        for depth in range(max(rounds)):
            if max(len(t) for t in tokens) > self.head.max_nodes:
                break
            g, logits = self._run(requests, tokens, parents, outputs, frontier)  # [B, W, D], [B, F, V]
            outputs = g.clone()  # a replayed graph's outputs are overwritten by its next replay
            head_logp = torch.log_softmax(logits.double(), -1)  # [B, F, V]
            if sampled:
                dev = logits.device
                q = target_probs(logits[:, :1], temperature.to(dev), top_k.to(dev), top_p.to(dev))[:, 0]  # [B, V]
                choice = sample_from(q, coins[:, depth].to(dev))[:, None]  # [B, 1]
                picked_logp = head_logp[:, 0].gather(1, choice)[:, :, None].cpu().numpy()  # [B, 1, 1]
                picked_tok = choice[:, :, None].cpu().numpy()
            else:
                top = head_logp.topk(k, dim=-1)  # [B, F, k]
                picked_logp, picked_tok = top.values.cpu().numpy(), top.indices.cpu().numpy()
            for b in range(B):
                if depth >= rounds[b]:
                    frontier[b] = [0]  # done: its rows are computed and ignored
                    continue
                fresh = []
                for j, u in enumerate(frontier[b]):
                    if sampled:
                        drawn_from[b].append(q[b].detach().cpu())
                    for c in range(picked_tok.shape[-1]):
                        parents[b].append(u)
                        tokens[b].append(int(picked_tok[b, j, c]))
                        logp[b].append(logp[b][u] + float(picked_logp[b, j, c]))
                        fresh.append(len(tokens[b]) - 1)
                fresh.sort(key=lambda i: (-logp[b][i], i))
                frontier[b] = fresh[:k]
        return [self._draft(t, p, lp, drawn_from[b] if sampled else None, max_nodes)
                for b, (t, p, lp) in enumerate(zip(tokens, parents, logp))]

    def _grown(self, requests: Sequence[DraftRequest], rounds: int, k: int, max_nodes: int) -> list[Draft]:
        """Every request's greedy draft (chain: ``k`` = 1) of ``rounds`` rounds in one head call
        (:meth:`MTPHead.grow`: the rounds run on the device, one read at the end): the drafts the round-by-round
        growth below draws."""
        slots = torch.tensor([r.slot for r in requests], dtype=torch.int32)
        pending = torch.tensor([int(r.context[-1]) for r in requests], dtype=torch.int64)
        root = torch.stack([self._root[r.slot] for r in requests]).to(self.head.device)  # [B, D]
        tokens, parents, logp = (t.cpu().tolist() for t in self.head.grow(slots, pending, root, rounds, k))
        return [self._draft(t, p, lp, None, max_nodes) for t, p, lp in zip(tokens, parents, logp)]

    @staticmethod
    def _draft(tokens: list[int], parents: list[int], logp: list[float], drawn_from: list[torch.Tensor] | None,
               max_nodes: int) -> Draft:
        """A :class:`Draft`: confidences ``exp(cumulative log-probability)`` (kept above 0: the smallest normal
        float64 where it underflows, which keeps them non-increasing); sampled chains carry the distribution each
        node's child was drawn from (the leaf's row: zeros)."""
        confidence = np.maximum(np.exp(np.array(logp)), np.finfo(np.float64).tiny)
        confidence[0] = 1.0
        if drawn_from is None:
            return Draft(tokens, parents, confidence).cut(max_nodes)
        rows = drawn_from[: len(tokens) - 1]
        proposal = torch.stack([*rows, torch.zeros_like(rows[0])]) if rows else None
        return Draft(tokens, parents, confidence, "iid" if rows else "deterministic", proposal)
