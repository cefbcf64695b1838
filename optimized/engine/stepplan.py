"""What a step runs, decided before it runs: the drafts and the budget's decision (:meth:`Engine.step`).

On one process: the budget says whether to draft and how large (``want_draft``, ``draft_size``), the drafter
proposes, and the budget picks the node bucket from the drafts' confidences (or falls back to autoregressive).

Tensor parallel (the target's :class:`~lumotree.optimized.parallel.Parallel`): the drafter and the budget run on rank
0 (the budget reads wall-clock times, which differ between ranks) and the plan, drafts and decision, is broadcast
once a step, so every rank verifies the same trees and makes the same collective calls. A drafter that runs the
(sharded) target or a model sharing its weights (``runs_model``, true unless the drafter says otherwise) has to run
on every rank: rank 0 first broadcasts whether and how large to draft, and every rank proposes in lockstep.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, NamedTuple

import numpy as np
import torch

from .budget import Decision, ExpectedThroughputBudget
from .drafters import Draft, DraftRequest

__all__ = ["StepPlan", "plan_step"]


class StepPlan(NamedTuple):
    """``drafts`` (None: an autoregressive step), the budget's ``decision`` (None: no draft was made), the seconds
    the drafter took, and the drafter's view of the batch (None when it did not propose)."""

    drafts: list[Draft] | None
    decision: Decision | None
    draft_s: float
    requests: list[DraftRequest] | None


def _on_host(drafts: list[Draft] | None) -> list[Draft] | None:
    """Drafts whose proposals live on the host (a broadcast pickles them; the receiver moves them to its device)."""
    if drafts is None:
        return None
    return [d if d.proposal is None else dataclasses.replace(d, proposal=d.proposal.cpu()) for d in drafts]


def plan_step(engine: Any, batch: list) -> StepPlan:
    """The plan of one step over the running requests ``batch`` (module docstring)."""
    par = engine.parallel
    B = len(batch)
    lead = par.rank == 0
    runs_model = bool(getattr(engine.drafter, "runs_model", True))
    want, size = False, 0
    if engine.mode != "autoregressive":
        if lead:
            want = engine.budget.want_draft(B)
            size = engine.budget.draft_size(B) if want else 0
        if par.active and runs_model:
            want, size = par.broadcast_object((want, size))
    drafts: list[Draft] | None = None
    decision, draft_s, requests = None, 0.0, None
    if want and (lead or runs_model):
        requests = [engine._draft_request(r) for r in batch]
        td = time.perf_counter()
        drafts = engine.drafter.propose(requests, size, engine.mode == "chain")
        if engine.model.device.type == "cuda":
            torch.cuda.synchronize(engine.model.device)
        draft_s = time.perf_counter() - td
        if lead:
            budget = engine.budget
            if isinstance(budget, ExpectedThroughputBudget):
                widest = max(drafts, key=lambda d: d.num_nodes)  # its depth: one O(N) pass, not one per request
                budget.record_draft_time(B, draft_s, max(widest.depth()))
            if all(d.variant == "deterministic" for d in drafts):
                decision = budget.choose(B, [d.sorted_confidences() for d in drafts], draft_s)
                if decision.autoregressive:
                    drafts = None
            else:  # sampled drafts: the decision was made before drawing (want_draft) and is not revisited
                largest = max(d.num_nodes for d in drafts)
                decision = Decision(largest, B + sum(float(np.sum(d.confidence[1:])) for d in drafts),
                                    budget.profile.verify_time(B, largest), "sampled drafts, verified whole")
    if par.active and engine.mode != "autoregressive":  # the one broadcast of the trees a step
        drafts, decision = par.broadcast_object((_on_host(drafts), decision))
    return StepPlan(drafts, decision, draft_s, requests)
