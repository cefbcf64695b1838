r"""Acceptance profiles and the replay drafter: what a real drafter's acceptance on a trained model would give on a
model of another size.

**The acceptance profile** of a drafter on a target and a workload (:class:`AcceptanceProfile`, a JSON file): for
every draft depth d >= 1 and sibling rank r >= 0 (rank 0: the most confident child of its parent), ``proposed[d][r]``
= how many rank-r children at depth d the drafter proposed under a node the target accepted, ``accepted[d][r]`` = how
many of those the target accepted, and their ratio, the measured probability

    a(d, r) = P(target accepts the rank-r candidate at depth d | its parent was accepted).

Beside it, per (d, r), the drafter's mean reported conditional confidence (its path confidence over its parent's) and
a reliability table of path confidences (ten bins: nodes proposed, nodes on the accepted path): how calibrated the
confidences the budget sums are. :func:`record_acceptance` measures a profile with the engine (greedy, every tree
verified whole at a fixed size, so the trees recorded are the trees verified; the outputs are checked against the
autoregressive ones by the caller) through :class:`AcceptanceRecorder`, a wrapper around any deterministic drafter.

**The replay drafter** (:class:`ReplayDrafter`) — **it reads the target's own greedy continuation (an oracle), like
the synthetic drafter it extends; it measures systems, it is not a way to decode**: on any target (e.g. a full-size
random model of :data:`~lumotree.optimized.model.RANDOM_CONFIGS`) it drafts the best-first tree of a profile: a
child of rank r under a node of depth d - 1 has path confidence ``conf(parent) a(d, r)``; at every node on the
oracle path it draws the rank at which the true next token sits, rank r with probability ``a(d, r)`` (none with
``1 - sum_r a(d, r)``), so the target accepts each proposed candidate with exactly the recorded probability, depth by
depth and rank by rank, and the confidences are calibrated by construction. Verification is unchanged (it stays
lossless: the drafter only chooses what to propose). What it measures: the throughput a model of the replayed size
would see if its drafter accepted as the profiled drafter did on the trained model; what it cannot carry over is the
drafter's own cost (the replay's is a table look-up) and correlations across depths (each depth draws on its own).
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .drafters import Draft, DraftRequest, EngineDrafter, SyntheticDrafter

__all__ = ["AcceptanceProfile", "AcceptanceRecorder", "ReplayDrafter", "record_acceptance", "replay_template"]

PROFILE_KIND = "lumotree.acceptance_profile"
CALIBRATION_BINS = 10


def _matrix(rows: Sequence[Sequence[float]], name: str) -> np.ndarray:
    try:
        out = np.asarray(rows, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a depth x rank table of numbers") from None
    if out.ndim != 2 or out.shape[0] < 1 or out.shape[1] < 1 or not np.isfinite(out).all() or (out < 0).any():
        raise ValueError(f"{name} must be a non-empty depth x rank table of finite numbers >= 0")
    return out


@dataclass
class AcceptanceProfile:
    """Per depth (row d - 1 for depth d) and sibling rank (column r) counts of one drafter on one target and workload
    (module docstring). ``calibration``: per path-confidence bin ``[k/10, (k+1)/10)``, [nodes proposed, nodes on the
    accepted path]. ``meta``: what was measured (drafter, workload, model, mode, tree size, steps, accepted length)."""

    proposed: np.ndarray  # [D, K]
    accepted: np.ndarray  # [D, K]
    confidence_sum: np.ndarray  # [D, K] sum of the drafter's conditional confidences of the counted candidates
    calibration: np.ndarray = field(default_factory=lambda: np.zeros((CALIBRATION_BINS, 2)))  # [bins, 2]
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.proposed = _matrix(self.proposed, "proposed")
        self.accepted = _matrix(self.accepted, "accepted")
        self.confidence_sum = _matrix(self.confidence_sum, "confidence_sum")
        self.calibration = np.asarray(self.calibration, dtype=np.float64).reshape(CALIBRATION_BINS, 2)
        if not (self.proposed.shape == self.accepted.shape == self.confidence_sum.shape):
            raise ValueError("proposed, accepted and confidence_sum must have the same depth x rank shape")
        if (self.accepted > self.proposed).any():
            raise ValueError("accepted must not exceed proposed at any depth and rank")
        if (self.accepted.sum(1) > self.proposed.max(1) + 1e-9).any():
            # at most one sibling is accepted under each accepted parent (each proposes a rank-0 child)
            raise ValueError("accepted: more acceptances at a depth than parents that proposed there")

    @classmethod
    def empty(cls, depths: int, ranks: int, **meta: Any) -> AcceptanceProfile:
        z = np.zeros((depths, ranks))
        return cls(z, z.copy(), z.copy(), meta=dict(meta))

    @property
    def depths(self) -> int:
        return self.proposed.shape[0]

    @property
    def ranks(self) -> int:
        return self.proposed.shape[1]

    def acceptance(self) -> np.ndarray:
        """``a(d, r)`` [D, K]: accepted / proposed, 0 where nothing was proposed (never proposed: never replayed)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.proposed > 0, self.accepted / np.maximum(self.proposed, 1), 0.0)

    def mean_confidence(self) -> np.ndarray:
        """The drafter's mean conditional confidence per (d, r) [D, K] (NaN where nothing was proposed)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.proposed > 0, self.confidence_sum / np.maximum(self.proposed, 1), np.nan)

    def grow(self, depths: int, ranks: int) -> None:
        """Make room for depth ``depths`` and rank ``ranks - 1`` (zero counts)."""
        D, K = max(depths, self.depths), max(ranks, self.ranks)
        if (D, K) != self.proposed.shape:
            for name in ("proposed", "accepted", "confidence_sum"):
                old = getattr(self, name)
                new = np.zeros((D, K))
                new[: old.shape[0], : old.shape[1]] = old
                setattr(self, name, new)

    def merge(self, other: AcceptanceProfile) -> AcceptanceProfile:
        """The counts of both (same drafter measured on more text)."""
        out = AcceptanceProfile(self.proposed, self.accepted, self.confidence_sum, self.calibration.copy(),
                                dict(self.meta))
        out.grow(other.depths, other.ranks)
        for name in ("proposed", "accepted", "confidence_sum"):
            getattr(out, name)[: other.depths, : other.ranks] += getattr(other, name)
        out.calibration += other.calibration
        return out

    def to_dict(self) -> dict:
        acc, conf = self.acceptance(), self.mean_confidence()
        return {
            "kind": PROFILE_KIND, "version": 1, "meta": self.meta,
            "depths": self.depths, "ranks": self.ranks,
            "proposed": self.proposed.astype(int).tolist(), "accepted": self.accepted.astype(int).tolist(),
            "confidence_sum": self.confidence_sum.tolist(),
            "acceptance": [[float(x) for x in row] for row in acc],
            "mean_confidence": [[None if np.isnan(x) else float(x) for x in row] for row in conf],
            "calibration": {"bins": [[k / CALIBRATION_BINS, (k + 1) / CALIBRATION_BINS]
                                     for k in range(CALIBRATION_BINS)],
                            "proposed": self.calibration[:, 0].astype(int).tolist(),
                            "accepted": self.calibration[:, 1].astype(int).tolist()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AcceptanceProfile:
        if not isinstance(data, Mapping) or data.get("kind") != PROFILE_KIND:
            raise ValueError(f"not an acceptance profile (expected kind = {PROFILE_KIND!r})")
        for key in ("proposed", "accepted", "confidence_sum"):
            if key not in data:
                raise ValueError(f"acceptance profile: missing {key!r}")
        cal = data.get("calibration") or {}
        calibration = np.stack([np.asarray(cal.get("proposed", [0] * CALIBRATION_BINS), dtype=np.float64),
                                np.asarray(cal.get("accepted", [0] * CALIBRATION_BINS), dtype=np.float64)], 1)
        return cls(data["proposed"], data["accepted"], data["confidence_sum"], calibration, dict(data.get("meta", {})))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> AcceptanceProfile:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"path = {str(path)!r} is not an acceptance profile file")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON ({exc.msg})") from None
        try:
            return cls.from_dict(data)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None


# ======================================================================================================= recording
def _child_ranks(draft: Draft) -> tuple[list[list[int]], list[int]]:
    """(children of every node in rank order, depth of every node): siblings ranked by path confidence, descending,
    ties in index order."""
    children: list[list[int]] = [[] for _ in range(draft.num_nodes)]
    for i in range(1, draft.num_nodes):
        children[draft.parents[i]].append(i)
    for kids in children:
        kids.sort(key=lambda i: (-draft.confidence[i], i))
    return children, draft.depth()


def count_step(profile: AcceptanceProfile, draft: Draft, accepted_tokens: Sequence[int]) -> None:
    """Add one verified draft to ``profile``: ``accepted_tokens`` are the draft tokens the target accepted (the
    committed tokens after the pending one), a path from the root. Raises if they are not a path of the draft."""
    children, depth = _child_ranks(draft)
    conf = draft.confidence
    profile.grow(max(depth), max((len(k) for k in children), default=0))
    on_path = {0}
    node = 0
    for step in range(len(accepted_tokens) + 1):
        nxt = int(accepted_tokens[step]) if step < len(accepted_tokens) else None
        hit = -1
        for rank, c in enumerate(children[node]):
            d = depth[c] - 1
            profile.proposed[d, rank] += 1
            profile.confidence_sum[d, rank] += conf[c] / conf[node] if conf[node] > 0 else 0.0
            if nxt is not None and draft.tokens[c] == nxt and hit < 0:
                profile.accepted[d, rank] += 1
                hit = c
        if nxt is None:
            break
        if hit < 0:
            raise ValueError(f"accepted token {nxt} at depth {step + 1} is not a child of the accepted path: the tree "
                             "recorded is not the tree verified (record with a fixed budget)")
        node = hit
        on_path.add(node)
    bins = np.minimum((np.asarray(conf[1:]) * CALIBRATION_BINS).astype(int), CALIBRATION_BINS - 1)
    np.add.at(profile.calibration[:, 0], bins, 1)
    np.add.at(profile.calibration[:, 1], bins, [i + 1 in on_path for i in range(len(bins))])


class AcceptanceRecorder:
    """Wraps a deterministic drafter and counts, step by step, which of its candidates the target accepted
    (:func:`count_step`) into ``profile``. It cuts every draft to the ``max_nodes`` the engine asks for (and the
    context's room when ``max_seq_len`` is given), so with the fixed budget the trees it counts are those verified.
    Everything else is the wrapped drafter's."""

    synthetic = False

    def __init__(self, drafter: EngineDrafter, max_seq_len: int | None = None,
                 profile: AcceptanceProfile | None = None):
        self.drafter = drafter
        self.name = drafter.name
        self.description = drafter.description
        self.synthetic = bool(getattr(drafter, "synthetic", False))
        self.max_seq_len = max_seq_len
        self.profile = profile if profile is not None else AcceptanceProfile.empty(1, 1, drafter=drafter.name)
        self.steps = 0
        self.accepted_tokens = 0
        self._drafts: dict[int, Draft] = {}

    def admit(self, slot: int, prompt: Sequence[int]) -> None:
        self.drafter.admit(slot, prompt)

    def release(self, slot: int) -> None:
        self._drafts.pop(slot, None)
        self.drafter.release(slot)

    def propose(self, requests: Sequence[DraftRequest], max_nodes: int, chain: bool) -> list[Draft]:
        drafts = self.drafter.propose(requests, max_nodes, chain)
        out = []
        for r, d in zip(requests, drafts):
            if d.variant != "deterministic":
                raise ValueError(f"drafter {self.name!r} drew a sampled draft: acceptance is recorded for greedy, "
                                 "deterministic drafts")
            room = None if self.max_seq_len is None else max(0, self.max_seq_len - len(r.context))
            cut = d.cut(max_nodes, room)
            self._drafts[r.slot] = cut
            out.append(cut)
        return out

    def advance(self, requests: Sequence[DraftRequest], committed: Sequence[Sequence[int]]) -> None:
        for r, new in zip(requests, committed):
            draft = self._drafts.pop(r.slot, None)
            if draft is not None:
                count_step(self.profile, draft, list(new)[1:])
                self.steps += 1
                self.accepted_tokens += len(new) - 1
        self.drafter.advance(requests, committed)


def record_acceptance(target: Any, drafter: EngineDrafter, prompts: Sequence[Sequence[int]], new_tokens: int,
                      max_nodes: int, mode: str = "tree", stop_token_ids: Sequence[int] = (), seed: int = 0,
                      **meta: Any) -> tuple[AcceptanceProfile, list[Any]]:
    """(profile, the engine's :class:`~lumotree.optimized.engine.GenerationResult` per prompt): ``prompts`` decoded greedily by the engine with ``drafter`` at the fixed tree size
    ``max_nodes`` (every tree verified whole), every step's acceptance counted."""
    from .engine import Engine
    from .sampling import SamplingParams

    recorder = AcceptanceRecorder(drafter, getattr(target, "max_seq_len", None))
    engine = Engine(target, recorder, mode=mode, budget="fixed", max_nodes=max_nodes, seed=seed)
    out = engine.generate([list(p) for p in prompts],
                          SamplingParams(max_new_tokens=new_tokens, stop_token_ids=tuple(stop_token_ids)))
    profile = recorder.profile
    profile.meta.update(drafter=drafter.name, mode=mode, max_nodes=int(engine.max_nodes), steps=recorder.steps,
                        requests=len(prompts),
                        mean_accepted=recorder.accepted_tokens / recorder.steps if recorder.steps else 0.0, **meta)
    return profile, out


# ======================================================================================================= replay
def replay_template(nodes: int, acceptance: np.ndarray, chain: bool = False
                    ) -> tuple[list[int], list[int], list[float], list[int]]:
    """The ``nodes``-node tree of highest path confidence when a rank-r child at depth d has conditional confidence
    ``acceptance[d - 1, r]``: (parents, ranks, path confidences, depths), best-first (confidences non-increasing in
    index order). Candidates of zero acceptance are never proposed; ``chain``: rank 0 only."""
    D, K = acceptance.shape
    ranks_used = 1 if chain else K
    parents, ranks, conf, depth = [-1], [-1], [1.0], [0]
    heap: list[tuple[float, int, int, int]] = []  # (-confidence, tie, parent, rank)
    tie = 0

    def push_children(u: int) -> None:
        nonlocal tie
        if depth[u] >= D:
            return
        for r in range(ranks_used):
            q = float(acceptance[depth[u], r])
            if q > 0:
                tie += 1
                heapq.heappush(heap, (-(conf[u] * q), tie, u, r))

    push_children(0)
    while len(parents) < nodes and heap:
        neg, _, parent, rank = heapq.heappop(heap)
        parents.append(parent)
        ranks.append(rank)
        conf.append(-neg)
        depth.append(depth[parent] + 1)
        push_children(len(parents) - 1)
    return parents, ranks, conf, depth


class ReplayDrafter(SyntheticDrafter):
    """**Reads an oracle — for system benchmarks only.** Drafts whose acceptance follows ``profile`` (an
    :class:`AcceptanceProfile`) depth by depth and rank by rank (module docstring). ``oracle`` maps each prompt to
    the target's greedy continuation (from an autoregressive run on the same target). Only meaningful with greedy
    verification."""

    name = "replay"
    synthetic = True

    def __init__(self, profile: AcceptanceProfile, oracle: Mapping[tuple[int, ...], Sequence[int]], vocab_size: int,
                 seed: int = 0):
        acceptance = profile.acceptance()
        if not (acceptance > 0).any():
            raise ValueError("profile: no candidate was ever accepted (nothing to replay)")
        if (acceptance.sum(1) > 1 + 1e-9).any():
            raise ValueError("profile: the acceptances of one depth sum to more than 1")
        super().__init__(0.5, oracle, vocab_size, branching=profile.ranks, seed=seed)
        self.profile = profile
        self.table = acceptance  # [D, K]
        # the rank of the true token under a node of depth d - 1 is drawn from row d - 1's cumulative sums; a node at
        # the deepest profiled depth has no children (an all-ones row: every draw is past the last rank, a miss)
        self._cumulative = np.vstack([np.cumsum(acceptance, 1), np.ones((1, profile.ranks))])  # [D + 1, K]
        self.acceptance = float(acceptance[0, 0])
        self.rank_confidence = [float(x) for x in acceptance.max(0)]  # only its length (the width) is used
        source = profile.meta.get("drafter", "?")
        self.description = (f"REPLAY (benchmarks only): oracle drafts accepting as {source!r} did "
                            f"({profile.depths} depths x {profile.ranks} ranks, measured)")
        self._depths: dict[tuple[int, bool], np.ndarray] = {}

    def _template(self, nodes: int, chain: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
        key = (nodes, chain)
        if key not in self._templates:
            parents, ranks, conf, depth = replay_template(nodes, self.table, chain)
            child_at = np.full((len(parents), self.profile.ranks), -1, dtype=np.int64)  # [n, K]
            for i in range(1, len(parents)):
                child_at[parents[i], ranks[i]] = i
            self._templates[key] = (np.array(parents), np.array(ranks), np.array(conf), child_at, max(depth))
            self._depths[key] = np.minimum(np.array(depth), self.profile.depths)  # [n]
        return self._templates[key]

    def _draw_hits(self, B: int, n: int, nodes: int, chain: bool) -> np.ndarray:
        """[B, n]: the rank at which the true next token sits among the children of each node, drawn with the
        profile's probabilities of the children's depth (>= the width: absent)."""
        cumulative = self._cumulative[self._depths[(nodes, chain)]]  # [n, K]
        return (self.rng.random((B, n))[:, :, None] >= cumulative[None, :, :]).sum(-1)
