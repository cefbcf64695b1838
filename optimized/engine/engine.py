r"""The decoding runtime: continuous batching, slots, speculation modes, the verification budget.

``Engine(model, drafter, mode=...)`` decodes many requests at once. Each request holds a *slot* of the model's cache
pools (GDN recurrent and conv states, KV) from admission to its end; requests join (prefill) and leave between steps
(continuous batching). A step is either

- **autoregressive**: one decode of every running request's pending token; or
- **speculative** (``mode="chain"``: one path per request, ``"tree"``: a tree): the drafter proposes a tree rooted at
  each pending token, the budget picks the node bucket N (or falls back to autoregressive), the trees are cut to N,
  the model verifies all of them in one batched pass (logits of every node), the lossless verification of
  :mod:`lumotree.optimized.engine.sampling` picks each request's accepted path and next token, and the model commits
  every accepted path in one call.

Per request, the context is ``prompt + output``; its last token is *pending* (sampled, not yet run through the
model), so the model's cache holds ``context[:-1]``. The first output token comes from the prompt's prefill.

The model follows :class:`TargetModel` (slot-addressed ``prefill / decode / verify / commit / release``).
:class:`ReferenceTarget` adapts the exact float64 reference model (CPU, one cache per slot);
:class:`OptimizedTarget` adapts :mod:`lumotree.optimized.model` (pools by slot, CUDA graphs per (B, N) bucket).

With a :class:`~lumotree.optimized.engine.prefix_cache.PrefixCache` (``prefix_cache=``), a prompt that extends a
cached prefix restores its K / V and GDN / conv states and prefills only the rest, and each request's states are kept
where its prompt's last block ends and where it ends.

Requests beyond the free slots wait in a queue (the pools are allocated once, so a large batch never runs out of
memory mid-way); ``submit`` validates prompts and sampling parameters before anything runs.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from numbers import Integral
from typing import Any

import numpy as np
import torch

from .budget import (
    AutoregressiveOnly,
    BudgetPolicy,
    CostProfile,
    ExpectedThroughputBudget,
    FixedBudget,
    RatioRuleBudget,
    make_budget,
)
from ..model.memory import BATCH_BUCKETS, NODE_BUCKETS
from . import prefix_cache as prefixes
from . import profiling
from ..parallel.context import SINGLE
from .drafters import Draft, DraftRequest, EngineDrafter
from .stepplan import plan_step
from .records import EngineStats, GenerationResult, Request, StepRecord, TokenEvent
from .targets import OptimizedTarget, ReferenceTarget, TargetModel
from .sampling import (
    SamplingParams,
    TreeBatch,
    VerifyOutcome,
    counter_uniforms,
    sample_from,
    target_probs,
    verify_batch,
    verify_greedy,
)

__all__ = [
    "TargetModel",
    "ReferenceTarget",
    "OptimizedTarget",
    "Engine",
    "Request",
    "TokenEvent",
    "GenerationResult",
    "StepRecord",
    "EngineStats",
    "MODES",
    "DEFAULT_NODE_BUCKETS",
]

MODES = ("autoregressive", "chain", "tree")
DEFAULT_NODE_BUCKETS = NODE_BUCKETS
_DRAFT_STREAM = 1  # counter_uniforms stream of drafting coins (recursive rejection sampling uses stream 0)
_POSITION_STREAM = 2  # counter_uniforms stream of the coins by output position (sampling the target's tokens)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ======================================================================================================= engine
class Engine:
    """Continuous-batching decoder with autoregressive, chain and tree speculation (module docstring).

    - ``model``: a :class:`TargetModel` (or a reference / optimized model, wrapped automatically).
    - ``drafter``: an :class:`~lumotree.optimized.engine.drafters.EngineDrafter` (required for chain / tree).
    - ``budget``: ``"expected"`` (maximise expected tokens/s from confidences), ``"ratio"`` (baseline rule, ``eps``),
      ``"fixed"`` (always ``max_nodes``), or a :class:`~lumotree.optimized.engine.budget.BudgetPolicy`.
    - ``profile``: a :class:`~lumotree.optimized.engine.budget.CostProfile` or a JSON path; None measures one at
      start-up when the budget needs it (:meth:`measure_profile`).
    - ``max_batch``: most requests decoded at once (default: the model's slots); more wait in the queue.
    - ``prefix_cache``: a :class:`~lumotree.optimized.engine.prefix_cache.PrefixCache` (None: every prompt prefills
      whole); the model needs the prefix-cache methods of :class:`TargetModel`.
    """

    def __init__(
        self,
        model: Any,
        drafter: EngineDrafter | None = None,
        *,
        mode: str = "tree",
        budget: str | BudgetPolicy = "expected",
        max_nodes: int = 64,
        eps: float = 0.1,
        profile: CostProfile | str | None = None,
        max_batch: int | None = None,
        node_buckets: Sequence[int] = DEFAULT_NODE_BUCKETS,
        batch_buckets: Sequence[int] | None = None,
        seed: int = 0,
        prefix_cache: prefixes.PrefixCache | None = None,
    ):
        self.model = self._wrap(model)
        #: tensor parallel: the target's process group (the drafter and the budget on rank 0, :mod:`.stepplan`)
        self.parallel = getattr(getattr(self.model, "model", None), "parallel", SINGLE)
        self.set_prefix_cache(prefix_cache)
        self._in_step = False  # a step is running (or raised): a slot's caches may not match its tokens
        if mode not in MODES:
            raise ValueError(f"mode = {mode!r}; expected one of {MODES}")
        if mode != "autoregressive" and drafter is None:
            raise ValueError(f"mode {mode!r} needs a drafter")
        if drafter is not None and not isinstance(drafter, EngineDrafter):
            raise TypeError(f"drafter must implement EngineDrafter (admit/propose/advance/release), got {drafter!r}")
        self.mode = mode
        self.drafter = drafter
        if isinstance(max_nodes, bool) or not isinstance(max_nodes, Integral) or max_nodes < 1:
            raise ValueError(f"max_nodes = {max_nodes!r} must be an integer >= 1")
        self.max_nodes = min(int(max_nodes), int(self.model.max_nodes))
        slots = int(self.model.num_slots)
        self.max_batch = slots if max_batch is None else int(max_batch)
        if not 1 <= self.max_batch <= slots:
            raise ValueError(f"max_batch = {max_batch!r} must be in [1, {slots}] (the model's slots)")
        self.node_buckets = tuple(sorted({int(n) for n in node_buckets if n <= self.max_nodes} | {1, self.max_nodes}))
        if batch_buckets is None:
            batch_buckets = sorted({*BATCH_BUCKETS, self.max_batch})
        self.batch_buckets = tuple(b for b in sorted(set(int(b) for b in batch_buckets)) if b <= self.max_batch)
        if not self.batch_buckets or self.batch_buckets[-1] < self.max_batch:
            self.batch_buckets = tuple(sorted(set(self.batch_buckets) | {self.max_batch}))
        self.seed_rng = np.random.default_rng(seed)
        self.free_slots: list[int] = list(range(slots))[::-1]
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished: dict[int, Request] = {}
        self.stats = EngineStats()
        self._next_id = 0
        self.eps = float(eps)
        self.profile: CostProfile | None = CostProfile.load(profile) if isinstance(profile, str) else profile
        self.budget = self._make_budget(budget)

    # ------------------------------------------------------------------------------------------------ set-up
    def set_prefix_cache(self, prefix_cache: prefixes.PrefixCache | None) -> None:
        """Use ``prefix_cache`` for the prompts admitted from now on (None: none)."""
        if prefix_cache is not None and not isinstance(prefix_cache, prefixes.PrefixCache):
            raise TypeError(f"prefix_cache must be a PrefixCache, got {type(prefix_cache).__name__}")
        if prefix_cache is not None and not prefixes.supports_prefix_cache(self.model):
            raise ValueError(f"prefix_cache: {type(self.model).__name__} cannot save and restore its caches "
                             "(read_kv / read_state / restore)")
        self.prefix_cache = prefix_cache

    @staticmethod
    def _wrap(model: Any) -> TargetModel:
        if isinstance(model, TargetModel):
            return model
        from lumotree.reference.model import HybridModel

        if isinstance(model, HybridModel):
            return ReferenceTarget(model)
        return OptimizedTarget(model)

    def _make_budget(self, budget: str | BudgetPolicy) -> BudgetPolicy:
        if isinstance(budget, BudgetPolicy):
            return budget
        if self.mode == "autoregressive" or budget == "none":
            return AutoregressiveOnly(self.profile or self._flat_profile())
        if budget == "fixed":
            return FixedBudget(self.profile or self._flat_profile(), self.max_nodes)
        if self.profile is None:
            self.profile = self.measure_profile()
        if budget == "ratio":
            return RatioRuleBudget(self.profile, eps=self.eps, max_nodes=self.max_nodes)
        if budget == "expected":
            return ExpectedThroughputBudget(self.profile, max_nodes=self.max_nodes,
                                            drafter=getattr(self.drafter, "name", type(self.drafter).__name__))
        return make_budget(budget, self.profile)

    def _flat_profile(self) -> CostProfile:
        """Placeholder costs for policies that ignore them (fixed / none): every step costs one unit."""
        return CostProfile(
            self.batch_buckets,
            self.node_buckets,
            {b: 1.0 for b in self.batch_buckets},
            {(b, n): 1.0 for b in self.batch_buckets for n in self.node_buckets},
            note="flat placeholder (budget ignores costs)",
        )

    def measure_profile(self, repeats: int = 5, prompt_len: int = 16, time_limit: float | None = None) -> CostProfile:
        """The step costs of this engine's model at every (batch, node) bucket
        (:func:`~lumotree.optimized.engine.profiling.measure_profile`)."""
        return profiling.measure_profile(self, repeats, prompt_len, time_limit)

    def profile_key(self) -> dict:
        """What a cost profile depends on (:func:`~lumotree.optimized.engine.profiling.profile_key`)."""
        return profiling.profile_key(self)

    def warm_up(self, sampling: bool = False, progress: Callable[[str], None] | None = None) -> float:
        """Compile the kernels and capture the CUDA graphs of every step shape before the first request
        (:func:`~lumotree.optimized.engine.profiling.warm_up`); returns the seconds it took."""
        return profiling.warm_up(self, sampling, progress)

    # ------------------------------------------------------------------------------------------------ requests
    def submit(self, prompt: Sequence[int], params: SamplingParams | None = None) -> int:
        """Queue a request; returns its id. Raises ``ValueError`` for an empty prompt, ids outside the vocabulary, a
        prompt that leaves no room in the context, or bad sampling parameters."""
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
        items = list(prompt.tolist() if hasattr(prompt, "tolist") else prompt)
        if not items:
            raise ValueError("prompt is empty: a request needs at least one token")
        V = self.model.vocab_size
        for i, t in enumerate(items):
            if isinstance(t, bool) or not isinstance(t, Integral) or not 0 <= int(t) < V:
                raise ValueError(f"prompt[{i}] = {t!r} is not a token id in [0, {V})")
        limit = self.model.max_seq_len
        if len(items) >= limit:
            raise ValueError(
                f"prompt has {len(items)} tokens but the model's context holds {limit}: at most {limit - 1} prompt "
                "tokens leave room for one new token"
            )
        for i, t in enumerate(params.stop_token_ids):
            if t >= V:
                raise ValueError(f"stop_token_ids[{i}] = {t} is not a token id in [0, {V})")
        seed = int(params.seed) if params.seed is not None else int(self.seed_rng.integers(0, 2**62))
        request = Request(self._next_id, [int(t) for t in items], params, seed)
        self._next_id += 1
        self.waiting.append(request)
        return request.request_id

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, request_id: int) -> bool:
        """End a waiting or running request now (``finish_reason`` ``"abort"``; a running one frees its slot and
        drafter state for the next step). Call between steps. Returns False when no such request is waiting or
        running."""
        request = next((r for r in self.waiting if r.request_id == request_id), None)
        if request is not None:
            self.waiting.remove(request)
            self.finished[request_id] = request
        else:
            request = next((r for r in self.running if r.request_id == request_id), None)
            if request is None:
                return False
            self._finish(request, keep=not self._in_step)
        request.finished, request.finish_reason = True, "abort"
        return True

    def _coins(self, requests: Sequence[Request], n: int, stream: int = 0) -> torch.Tensor:
        """``[B, n]`` coins of each request's current model call (its step counter): recursive rejection sampling
        of sampled drafts, and the drafts' own draws."""
        dev = self.model.device
        seeds = torch.tensor([r.seed for r in requests], dtype=torch.int64)
        counters = torch.tensor([r.counter for r in requests], dtype=torch.int64)
        return counter_uniforms(seeds, counters, n, stream).to(dev)

    def position_coins(self, requests: Sequence[Request], offsets: torch.Tensor) -> torch.Tensor:
        """``[B, N]`` coins by output position: request b's token at position ``len(output) + offsets[b, i]`` is
        drawn with the coin of ``(seed, position)``, whatever step draws it. ``offsets: [B, N]`` int64 (a node's
        depth), on the host."""
        B, N = offsets.shape
        seeds = torch.tensor([r.seed for r in requests], dtype=torch.int64)[:, None].expand(B, N)  # [B, N]
        positions = torch.tensor([len(r.output) for r in requests], dtype=torch.int64)[:, None] + offsets  # [B, N]
        return counter_uniforms(seeds.reshape(-1), positions.reshape(-1), 1, _POSITION_STREAM).view(B, N)

    @staticmethod
    def _param_tensors(requests: Sequence[Request]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-request ``temperature, top_k, top_p: [B]`` on the host."""
        temperature = torch.tensor([float(r.params.temperature) for r in requests], dtype=torch.float64)
        top_k = torch.tensor([int(r.params.top_k) for r in requests], dtype=torch.int64)
        top_p = torch.tensor([float(r.params.top_p) for r in requests], dtype=torch.float64)
        return temperature, top_k, top_p

    def _sample_rows(self, requests: Sequence[Request], logits: torch.Tensor) -> list[int]:
        """One token per request from ``logits: [B, V]`` (greedy rows: argmax)."""
        if all(r.params.greedy for r in requests):
            return logits.argmax(-1).tolist()
        dev = logits.device
        temperature, top_k, top_p = (t.to(dev) for t in self._param_tensors(requests))
        probs = target_probs(logits[:, None, :], temperature, top_k, top_p)[:, 0]  # [B, V]
        coins = self.position_coins(requests, torch.zeros(len(requests), 1, dtype=torch.int64))[:, 0].to(dev)
        return sample_from(probs, coins).tolist()

    def _emit(self, request: Request, tokens: Sequence[int]) -> TokenEvent:
        """Append tokens (cut at ``max_new_tokens``, a stop token, or a full context) and finish when due."""
        room = min(request.params.max_new_tokens - len(request.output),
                   self.model.max_seq_len - len(request.prompt) - len(request.output))
        new = [int(tok) for tok in tokens[: max(room, 0)]]
        reason = ""
        stops = request.params.stop_token_ids
        if stops:
            hit = next((i for i, tok in enumerate(new) if tok in stops), None)
            if hit is not None:  # the stop token is emitted, nothing after it
                new, reason = new[: hit + 1], "stop"
        request.extend_output(new)
        if not reason:
            if len(request.output) >= request.params.max_new_tokens:
                reason = "max_new_tokens"
            elif len(request.prompt) + len(request.output) >= self.model.max_seq_len:
                reason = "length"
        if reason:
            request.finished = True
            request.finish_reason = reason
        return TokenEvent(request.request_id, new, request.finished, reason)

    def _finish(self, request: Request, keep: bool = True) -> None:
        """Free ``request``'s slot; with a prefix cache, its states are kept first (``keep``: its caches are
        consistent, not after a failed step)."""
        if self.prefix_cache is not None and keep and request.cached:
            prefixes.keep(self.model, self.prefix_cache, request.slot, request.cached)
        self.model.release(request.slot)
        if self.drafter is not None:
            self.drafter.release(request.slot)
        self.free_slots.append(request.slot)
        self.running.remove(request)
        self.finished[request.request_id] = request

    def _admit(self) -> list[TokenEvent]:
        """Prefill waiting requests into free slots; their first tokens are sampled in one batch."""
        admitted: list[Request] = []
        rows: list[torch.Tensor] = []
        t0 = time.perf_counter()
        while self.waiting and self.free_slots and len(self.running) < self.max_batch:
            request = self.waiting.popleft()
            request.slot = self.free_slots.pop()
            rows.append(self._prefill(request))  # [V]
            if self.drafter is not None:
                self.drafter.admit(request.slot, request.prompt)
            self.running.append(request)
            admitted.append(request)
        if not admitted:
            return []
        first = self._sample_rows(admitted, torch.stack(rows))
        events = []
        for request, tok in zip(admitted, first):
            request.counter += 1
            events.append(self._emit(request, [tok]))
            if request.finished:
                self._finish(request)
        _sync(self.model.device)
        self.stats.steps.append(
            StepRecord("prefill", len(admitted), 0, len(admitted), 0, float(len(admitted)), 0.0, 0.0,
                       time.perf_counter() - t0)
        )
        return events

    def _prefill(self, request: Request) -> torch.Tensor:
        """The prompt's prefill into the request's slot (through the prefix cache when there is one): ``[V]``."""
        if self.prefix_cache is None:
            return self.model.prefill(request.slot, request.prompt)
        logits, request.prefix_hit = prefixes.prefill(self.model, self.prefix_cache, request.slot, request.prompt)
        request.cached = list(request.prompt)
        return logits

    # ------------------------------------------------------------------------------------------------ steps
    def step(self) -> list[TokenEvent]:
        """Admit waiting requests (prefill), then one decode or speculative step for every running request."""
        self._in_step = True
        events = self._step()
        self._in_step = False
        return events

    def _step(self) -> list[TokenEvent]:
        events = self._admit()
        batch = list(self.running)
        if not batch:
            return events
        t0 = time.perf_counter()
        B = len(batch)
        drafts, decision, draft_s, requests = plan_step(self, batch)  # rank 0's, tensor parallel
        tm = time.perf_counter()
        if drafts is None:  # the drafter's bookkeeping runs inside, while the device decodes
            committed, emitted_lists, accepted, predicted, nodes = self._autoregressive_step(batch, requests)
            kind, reason = "autoregressive", (decision.reason if decision else "no draft")
        else:
            assert decision is not None
            committed, emitted_lists, accepted, predicted, nodes = self._speculative_step(batch, drafts, decision.nodes)
            kind, reason = "verify", decision.reason
            self.budget.observe(decision, predicted, float(sum(accepted)), draft_s)
        model_s = time.perf_counter() - tm
        if self.prefix_cache is not None:
            for request, tokens in zip(batch, committed):
                request.cached.extend(tokens)
        if drafts is not None:
            self._advance_drafter(batch, requests, committed)
        emitted_total = 0
        for request, emitted, acc in zip(batch, emitted_lists, accepted):
            request.counter += 1
            request.steps += 1
            request.accepted += acc
            event = self._emit(request, emitted)
            emitted_total += len(event.tokens)
            events.append(event)
            if request.finished:
                self._finish(request)
        pred_tokens = B + predicted if kind == "verify" else float(B)
        record = StepRecord(kind, B, nodes, emitted_total, int(sum(accepted)), pred_tokens, draft_s, model_s,
                            time.perf_counter() - t0, reason)
        self.stats.steps.append(record)
        # the calibration sees the whole step but the draft (recorded apart): the bookkeeping of a speculative step
        # (several tokens a request, the drafter's advance) is host time the profile does not hold
        self.budget.observe_time(B, 0 if kind == "autoregressive" else nodes, record.total_s - record.draft_s)
        return events

    def _draft_request(self, r: Request) -> DraftRequest:
        return DraftRequest(r.slot, r.context, r.params, r.seed, r.counter, r.request_id,
                            r.params.max_new_tokens - len(r.output))

    def _advance_drafter(self, batch: list[Request], requests: list[DraftRequest] | None,
                         committed: list[list[int]]) -> None:
        if self.drafter is not None:
            self.drafter.advance(requests or [self._draft_request(r) for r in batch], committed)

    def _autoregressive_step(self, batch: list[Request], requests: list[DraftRequest] | None):
        """One decode of every request's pending token; the drafter's bookkeeping of those tokens runs on the host
        after the launch, before the logits are read, so it overlaps the device's step."""
        slots = torch.tensor([r.slot for r in batch], dtype=torch.int64)  # on the host (targets copy it in)
        pending = torch.tensor([r.output[-1] for r in batch], dtype=torch.int64)  # on the host (targets copy it in)
        committed = [[r.output[-1]] for r in batch]
        logits = self.model.decode(slots, pending)  # [B, V]
        self._advance_drafter(batch, requests, committed)
        nxt = self._sample_rows(batch, logits)
        return committed, [[t] for t in nxt], [0] * len(batch), 0.0, 1

    def _speculative_step(self, batch: list[Request], drafts: list[Draft], nodes: int):
        cut = []
        for r, d in zip(batch, drafts):
            if d.tokens[0] != r.output[-1]:
                raise ValueError(f"drafter {self.drafter.name!r} proposed a tree whose root is not the pending token")
            room = self.model.max_seq_len - 1 - r.cache_length  # deepest node position must stay in the context
            max_depth = max(0, room)
            if d.variant == "deterministic":  # no deeper than the tokens left to emit: none verified in vain, and
                # the cache never holds tokens past the output (what the prefix cache keeps at the end)
                cut.append(d.cut(nodes, max(0, min(room, r.params.max_new_tokens - len(r.output) - 1))))
            elif max(d.depth()) > max_depth:
                raise ValueError(
                    f"drafter {self.drafter.name!r} drew a tree deeper than the context allows ({max_depth}); sampled "
                    "drafts cannot be cut"
                )
            else:
                cut.append(d)  # sampled drafts are verified whole (see Draft)
        width = max(c.num_nodes for c in cut)
        width = next((n for n in self.node_buckets if n >= width), width)
        draws = [c.draws for c in cut] if any(c.draws is not None for c in cut) else None
        host_trees = TreeBatch.pack([c.tokens for c in cut], [c.parents for c in cut], width=width, draws=draws)
        slots = torch.tensor([r.slot for r in batch], dtype=torch.int64)  # on the host (targets copy it in)
        if all(r.params.greedy for r in batch):
            outcome = self.speculate_greedy_step(slots, host_trees)
        else:
            outcome = self._speculate_sampled(batch, cut, slots, host_trees)
        emitted = outcome.emitted(host_trees)
        accepted = outcome.accepted_len.tolist()
        committed = [[r.output[-1]] + e[:-1] for r, e in zip(batch, emitted)]
        predicted = float(np.concatenate([c.confidence[1:] for c in cut]).sum())
        return committed, emitted, accepted, predicted, width

    def speculate_greedy_step(self, slots: torch.Tensor, host_trees: TreeBatch) -> VerifyOutcome:
        """Verify, greedy acceptance, commit: the model's fused call if it has one, else the three calls (queued
        behind each other; the outcome is the one read back). Returns the outcome on the host."""
        fused = getattr(self.model, "speculate_greedy", None)
        if fused is not None:
            return fused(slots, host_trees)
        trees = host_trees.to(self.model.device)  # before the verify launch (a later copy would wait for it)
        logits = self.model.verify(slots, trees)  # [B, N, V]
        outcome = verify_greedy(trees, logits.argmax(-1))
        self.model.commit(slots, trees, outcome.accepted_node)
        return outcome.to("cpu")

    def _speculate_sampled(self, batch: list[Request], cut: list[Draft], slots: torch.Tensor,
                           host_trees: TreeBatch) -> VerifyOutcome:
        """Verify, lossless acceptance, commit. Deterministic drafts: every node draws the target's token at its
        output position with that position's coin (:meth:`position_coins`) and the deepest path of drafted tokens
        equal to those draws is accepted: the text is the one autoregressive sampling draws with the same seed,
        whatever trees the budget verifies (and the acceptance that of recursive rejection sampling with point-mass
        proposals). Sampled drafts: recursive rejection sampling. The coins and the trees go to the device before
        the verify launch; nothing reads back until the outcome, after the commit is queued: one wait. Returns the
        outcome on the host."""
        variants = {c.variant for c in cut if c.num_nodes > 1}
        if len(variants) > 1:
            raise ValueError(f"drafts of one step mix variants {sorted(variants)}")
        variant = variants.pop() if variants else "deterministic"
        temperature, top_k, top_p = self._param_tensors(batch)
        if variant == "deterministic":
            position_coins = self.position_coins(batch, host_trees.depth.to(torch.int64))  # [B, N]
            trees = host_trees.to(self.model.device)
            logits = self.model.verify(slots, trees)  # [B, N, V]
            dev = logits.device
            probs = target_probs(logits, temperature.to(dev), top_k.to(dev), top_p.to(dev))  # [B, N, V]
            B, N, V = probs.shape
            draws = sample_from(probs.reshape(B * N, V), position_coins.reshape(-1).to(dev)).view(B, N)  # [B, N]
            outcome = verify_greedy(trees, draws)
            self.model.commit(slots, trees, outcome.accepted_node)
            return outcome.to("cpu")
        coins = self._coins(batch, host_trees.num_coins)  # builds the draw lists on the host
        trees = host_trees.to(self.model.device)
        logits = self.model.verify(slots, trees)  # [B, N, V]
        proposal = None
        if variant != "deterministic":
            proposal = torch.zeros_like(logits, dtype=torch.float64 if logits.dtype == torch.float64 else torch.float32)
            for b, c in enumerate(cut):
                if c.proposal is not None:
                    proposal[b, : c.num_nodes] = c.proposal.to(proposal)
        outcome = verify_batch(trees, logits, temperature, top_k, top_p, coins, variant, proposal)
        self.model.commit(slots, trees, outcome.accepted_node)
        return outcome.to("cpu")

    # ------------------------------------------------------------------------------------------------ drivers
    def stream(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams] | None = None
    ) -> Iterator[TokenEvent]:
        """Submit ``prompts`` and yield token events until all of them are done."""
        ids = self.submit_all(prompts, params)
        pending = set(ids)
        while pending:
            for event in self.step():
                if event.request_id in pending:
                    yield event
                    if event.finished:
                        pending.discard(event.request_id)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        on_event: Callable[[TokenEvent], None] | None = None,
    ) -> list[GenerationResult]:
        """Decode every prompt to the end; results in prompt order."""
        ids = self.submit_all(prompts, params)
        remaining = set(ids)
        while remaining:
            for event in self.step():
                if on_event is not None:
                    on_event(event)
                if event.finished:
                    remaining.discard(event.request_id)
        out = []
        for i in ids:
            r = self.finished[i]
            out.append(GenerationResult(i, r.prompt, list(r.output), r.finish_reason, r.steps, r.accepted))
        return out

    def submit_all(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams] | None = None
    ) -> list[int]:
        """Queue several requests (one parameter set for all, or one each); if any is invalid, none is queued."""
        if isinstance(params, SamplingParams) or params is None:
            per = [params] * len(prompts)
        else:
            per = list(params)
            if len(per) != len(prompts):
                raise ValueError(f"{len(per)} sampling parameter sets for {len(prompts)} prompts")
        ids: list[int] = []
        try:
            for prompt, p in zip(prompts, per):
                ids.append(self.submit(prompt, p))
        except Exception:
            queued = set(ids)
            self.waiting = deque(r for r in self.waiting if r.request_id not in queued)
            raise
        return ids
