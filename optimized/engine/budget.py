r"""The verification budget: how many draft nodes each step verifies, or whether to speculate at all.

A speculative step for a batch of B requests costs ``T_draft(B) + T_verify(B, N)`` seconds (N: the node bucket every
tree is padded to) and emits, for request b, ``1 + accepted_b`` tokens. An autoregressive step costs ``T_decode(B)``
and emits B tokens. The budget maximises expected tokens per second.

**Expected accepted tokens from drafter confidences.** A drafter reports, for every node, a *path confidence*: its
estimate of the probability that the node is accepted (the product of per-edge acceptance estimates along the path,
EAGLE-2's cumulative confidence). Expected accepted draft tokens of a tree are the sum of its nodes' path confidences
(linearity of expectation over the events "node i accepted"). Path confidences never increase along a path, so the
``n`` nodes of highest confidence (ties to the lower index) always form a subtree containing the root: the best
``n``-node tree. With the request's confidences sorted, ``c_1 >= c_2 >= ...``::

    E_b(n) = 1 + kappa * sum_{i < n} c_i          (tokens emitted by a step verifying n nodes)
    rate(N) = sum_b E_b(min(N, n_b)) / (T_verify(B, N) [+ T_draft(B) before drafting])
    rate_AR = B / T_decode(B)

``kappa`` calibrates the drafter: an exponential moving average of accepted over predicted draft tokens. The
profile's times are calibrated too: ``lambda_verify`` and ``lambda_decode`` are moving averages of the measured over
the profiled seconds of the engine's own speculative and autoregressive steps (host work the profile misses, other
load on the device), and scale ``T_verify`` and ``T_decode`` in every decision. The budget
takes the node bucket of largest rate (the draft of the step is paid for by then) and falls back to autoregressive
decoding unless that rate beats ``(1 + margin) rate_AR`` (``margin`` 0.1 by default: the cost model's measured error
on the H200 is up to ~7 %, and a marginal call is a loss as often as a gain). The drafter's measured cost and deepest
draft are kept per (drafter, batch bucket) in the profile: once known, a draft whose best case (every request
accepting as deep as the deepest draft seen) cannot beat decoding is not drafted at all; only a probe of its cost
runs, at most ``probe_cost_fraction`` of the time. When speculation including the draft's measured cost,
``sum_b E_b / (T_draft + T_verify)``, loses to ``rate_AR``, the next step drafts again if the verified drafts
saved more than the declined ones cost (``p G > (1 - p) T_draft``: moving averages of the share ``p`` of drafted
steps that were verified and of the seconds ``G`` a verified step saved against decoding its tokens one by one);
otherwise drafting backs off (1, 2, 4, .. up to ``max_backoff``
autoregressive steps without drafting before it drafts again, and at least ``T_draft / (probe_cost_fraction
T_decode)`` steps), so a useless or too expensive drafter costs one drafted step per backoff period, at most
~``probe_cost_fraction`` of the time in drafts (0.02 by default: a drafter that never pays keeps the engine within
2 % of autoregressive decoding). When only the calibration makes speculation lose (the uncalibrated
confidences would pay), that drafted step runs as a *probe* so the calibration can recover once the drafts improve.

**Baseline rule** (:class:`RatioRuleBudget`): the largest N with ``T_verify(B, N) <= (1 + eps) * T_decode(B)``,
confidences ignored.

:class:`CostProfile` holds the measured ``T_decode(B)`` and ``T_verify(B, N)`` at the engine's (B, N) buckets; it is
measured at start-up (``Engine.profile``) or loaded from JSON.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "CostProfile",
    "extrapolate_verify",
    "profile_cache_path",
    "Decision",
    "BudgetPolicy",
    "ExpectedThroughputBudget",
    "RatioRuleBudget",
    "FixedBudget",
    "AutoregressiveOnly",
    "make_budget",
    "expected_tokens",
]


def _drafter_key(text: str) -> tuple[str, int]:
    """``"name,B"`` (a profile JSON key) -> ``(name, B)``; the name may hold commas."""
    name, batch = text.rsplit(",", 1)
    return name, int(batch)


def _bucket(value: int, buckets: Sequence[int], what: str) -> int:
    for b in buckets:
        if value <= b:
            return b
    raise ValueError(f"{what} = {value} exceeds the largest bucket {buckets[-1]}")


@dataclass
class CostProfile:
    """Measured seconds per step: ``decode_s[B]`` (one autoregressive decode step) and ``verify_s[(B, N)]`` (one
    batched tree verify + commit at node bucket N), for the batch buckets ``batch_buckets`` and node buckets
    ``node_buckets`` (B and N are rounded up to a bucket, as the engine pads them). ``draft_s[(drafter, B)]``: the
    drafting seconds observed for a drafter at batch bucket B (a moving average the budget keeps here, so that engines
    sharing a profile know a drafter's cost before they pay for a draft), ``draft_depth[(drafter, B)]``: the deepest
    draft seen there (no step accepts more draft tokens than that)."""

    batch_buckets: tuple[int, ...]
    node_buckets: tuple[int, ...]
    decode_s: dict[int, float]
    verify_s: dict[tuple[int, int], float]
    device: str = ""
    note: str = ""
    draft_s: dict[tuple[str, int], float] = field(default_factory=dict)
    draft_depth: dict[tuple[str, int], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.batch_buckets = tuple(sorted(int(b) for b in self.batch_buckets))
        self.node_buckets = tuple(sorted(int(n) for n in self.node_buckets))
        if not self.batch_buckets or not self.node_buckets:
            raise ValueError("batch_buckets and node_buckets must be non-empty")
        for b in self.batch_buckets:
            if b not in self.decode_s:
                raise ValueError(f"decode_s has no entry for batch bucket {b}")
            for n in self.node_buckets:
                if (b, n) not in self.verify_s:
                    raise ValueError(f"verify_s has no entry for (batch, nodes) = ({b}, {n})")
        for key, t in list(self.decode_s.items()) + list(self.verify_s.items()):
            if not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
                raise ValueError(f"cost {key} = {t!r} must be a positive number of seconds")

    def batch_bucket(self, batch: int) -> int:
        return _bucket(batch, self.batch_buckets, "batch size")

    def node_bucket(self, nodes: int) -> int:
        return _bucket(nodes, self.node_buckets, "tree nodes")

    def decode_time(self, batch: int) -> float:
        return self.decode_s[self.batch_bucket(batch)]

    def verify_time(self, batch: int, nodes: int) -> float:
        return self.verify_s[(self.batch_bucket(batch), self.node_bucket(nodes))]

    def draft_time(self, drafter: str, batch: int) -> float | None:
        """Observed drafting seconds of ``drafter`` at ``batch``'s bucket, or None before any draft."""
        return self.draft_s.get((drafter, self.batch_bucket(batch)))

    def draft_max_depth(self, drafter: str, batch: int) -> int | None:
        return self.draft_depth.get((drafter, self.batch_bucket(batch)))

    def observe_draft(self, drafter: str, batch: int, seconds: float, depth: int | None = None,
                      decay: float = 0.5) -> None:
        if not (math.isfinite(seconds) and seconds >= 0):
            return
        key = (drafter, self.batch_bucket(batch))
        old = self.draft_s.get(key)
        self.draft_s[key] = seconds if old is None else decay * old + (1 - decay) * seconds
        if depth is not None:
            self.draft_depth[key] = max(int(depth), self.draft_depth.get(key, 0))

    @classmethod
    def measure(
        cls,
        time_decode: Callable[[int], float],
        time_verify: Callable[[int, int], float],
        batch_buckets: Sequence[int],
        node_buckets: Sequence[int],
        device: str = "",
        note: str = "",
        time_limit: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> CostProfile:
        """Call the timers at every bucket (they return seconds per step, e.g. a median of CUDA-graph replays):
        every decode bucket, then the verify buckets from the smallest up. Past ``time_limit`` seconds the verify
        buckets not yet measured are extrapolated (:func:`extrapolate_verify`; the note says how many). ``clock``:
        the seconds the limit reads (tensor parallel: rank 0's, so that every rank stops at the same bucket)."""
        start = clock()
        batch_buckets, node_buckets = sorted(int(b) for b in batch_buckets), sorted(int(n) for n in node_buckets)
        decode = {b: float(time_decode(b)) for b in batch_buckets}
        verify: dict[tuple[int, int], float] = {}
        for b in batch_buckets:
            for n in node_buckets:
                if time_limit is not None and verify and clock() - start > time_limit:
                    break
                verify[(b, n)] = float(time_verify(b, n))
        missing = [(b, n) for b in batch_buckets for n in node_buckets if (b, n) not in verify]
        if missing:
            verify = extrapolate_verify(decode, verify, batch_buckets, node_buckets)
            note = f"{note}; {len(missing)} of {len(verify)} verify buckets extrapolated (time limit)".strip("; ")
        return cls(tuple(batch_buckets), tuple(node_buckets), decode, verify, device, note)

    def to_dict(self) -> dict:
        return {
            "batch_buckets": list(self.batch_buckets),
            "node_buckets": list(self.node_buckets),
            "decode_s": {str(b): t for b, t in self.decode_s.items()},
            "verify_s": {f"{b},{n}": t for (b, n), t in self.verify_s.items()},
            "device": self.device,
            "note": self.note,
            "draft_s": {f"{d},{b}": t for (d, b), t in self.draft_s.items()},
            "draft_depth": {f"{d},{b}": n for (d, b), n in self.draft_depth.items()},
        }

    @classmethod
    def from_dict(cls, d: dict) -> CostProfile:
        known = {"batch_buckets", "node_buckets", "decode_s", "verify_s", "device", "note", "draft_s", "draft_depth"}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"cost profile has unknown keys {sorted(unknown)}")
        verify = {}
        for key, t in d["verify_s"].items():
            b, n = key.split(",")
            verify[(int(b), int(n))] = float(t)
        return cls(
            tuple(d["batch_buckets"]),
            tuple(d["node_buckets"]),
            {int(b): float(t) for b, t in d["decode_s"].items()},
            verify,
            d.get("device", ""),
            d.get("note", ""),
            {_drafter_key(k): float(t) for k, t in d.get("draft_s", {}).items()},
            {_drafter_key(k): int(n) for k, n in d.get("draft_depth", {}).items()},
        )

    def save(self, path: str | os.PathLike) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike) -> CostProfile:
        with open(path) as f:
            return cls.from_dict(json.load(f))


def extrapolate_verify(decode: dict[int, float], verify: dict[tuple[int, int], float], batch_buckets: Sequence[int],
                       node_buckets: Sequence[int]) -> dict[tuple[int, int], float]:
    """Every ``(B, N)`` verify cost from the measured ones: at a measured batch, past its largest measured node bucket
    ``m``, ``verify(B, m) * N / m`` (a step's work grows at most linearly in its tokens); at a batch with none,
    ``decode(B)`` times the measured ratio ``verify / decode`` of the nearest measured batch."""
    out = dict(verify)
    measured = sorted({b for b, _ in verify})
    for b in batch_buckets:
        for n in node_buckets:
            if (b, n) in out:
                continue
            done = [m for m in node_buckets if (b, m) in verify and m < n]
            if done:
                out[(b, n)] = verify[(b, done[-1])] * n / done[-1]
            else:
                near = min(measured, key=lambda m: abs(m - b))
                ref = out.get((near, n)) or max(v for (c, _), v in out.items() if c == near)
                out[(b, n)] = decode[b] * ref / decode[near]
    return out


def cumulative_confidences(confidences: Sequence[np.ndarray]) -> np.ndarray:
    """``[B, M + 1]``: column m = sum of each request's m largest confidences (rows padded with their total)."""
    width = max((len(c) for c in confidences), default=0)
    table = np.zeros((len(confidences), width + 1))
    if confidences and all(len(c) == width for c in confidences):  # one draft size (the common case): one cumsum
        table[:, 1:] = np.cumsum(np.stack(confidences), axis=1)
        return table
    for b, c in enumerate(confidences):
        table[b, 1 : len(c) + 1] = np.cumsum(c)
        table[b, len(c) + 1 :] = table[b, len(c)]
    return table


def expected_tokens(sorted_confidences: np.ndarray, nodes: int, kappa: float = 1.0) -> float:
    """``E(n) = 1 + kappa * sum of the n - 1 largest path confidences`` (``sorted_confidences``: non-root nodes,
    descending)."""
    return 1.0 + kappa * float(np.asarray(sorted_confidences)[: max(0, nodes - 1)].sum())


def batch_expected_tokens(confidences: Sequence[np.ndarray], nodes: int) -> float:
    """``sum_b E_b(n)`` of :func:`expected_tokens` (kappa 1) over a batch's sorted confidences, from one table."""
    table = cumulative_confidences(confidences)  # [B, M + 1]
    return len(confidences) + float(table[:, min(max(0, nodes - 1), table.shape[1] - 1)].sum())


@dataclass
class Decision:
    """One step's choice: ``nodes`` = the node bucket every tree is cut to (1 = autoregressive step), with the
    prediction it was made on (``predicted_tokens`` emitted, ``predicted_seconds``)."""

    nodes: int
    predicted_tokens: float
    predicted_seconds: float
    reason: str = ""

    @property
    def autoregressive(self) -> bool:
        return self.nodes <= 1


class BudgetPolicy:
    """Base class. ``want_draft(B)`` is asked before drafting (False: autoregressive step, no draft); ``choose`` after
    drafting, with each request's non-root path confidences sorted descending; ``observe`` after verification."""

    name = "base"

    def __init__(self, profile: CostProfile, max_nodes: int | None = None):
        self.profile = profile
        self.max_nodes = profile.node_buckets[-1] if max_nodes is None else int(max_nodes)
        if self.max_nodes < 1:
            raise ValueError(f"max_nodes = {max_nodes} must be >= 1")
        self.max_nodes = min(self.max_nodes, profile.node_buckets[-1])
        self._time_scale: dict[str, float] = {}

    def draft_size(self, batch: int) -> int:
        """How many nodes to ask the drafter for (the largest useful tree)."""
        return self.max_nodes

    def want_draft(self, batch: int) -> bool:
        return True

    def choose(self, batch: int, confidences: Sequence[np.ndarray], draft_seconds: float) -> Decision:
        raise NotImplementedError

    def observe(self, decision: Decision, predicted_accepted: float, accepted: float, draft_seconds: float) -> None:
        """``predicted_accepted``: sum over the batch of the verified trees' path confidences (uncalibrated);
        ``accepted``: draft tokens actually accepted."""

    #: weight of the past in the step-time calibration (moving averages of measured / profiled seconds)
    time_decay = 0.8

    def observe_time(self, batch: int, nodes: int, seconds: float) -> None:
        """A step's measured seconds, all but its draft (the engine's bookkeeping included: host time the profile
        does not hold; ``nodes`` = 0: an autoregressive decode step; else the node bucket of a verify step): updates
        ``lambda_decode`` / ``lambda_verify`` = moving average of measured / profiled."""
        if not (math.isfinite(seconds) and seconds > 0):
            return
        try:
            profiled = self.profile.decode_time(batch) if nodes == 0 else self.profile.verify_time(batch, nodes)
        except ValueError:  # outside the profiled buckets: nothing to compare with
            return
        key = "decode" if nodes == 0 else "verify"
        old = self._time_scale.get(key)
        ratio = seconds / profiled
        self._time_scale[key] = ratio if old is None else self.time_decay * old + (1 - self.time_decay) * ratio

    @property
    def lambda_decode(self) -> float:
        return self._time_scale.get("decode", 1.0)

    @property
    def lambda_verify(self) -> float:
        return self._time_scale.get("verify", 1.0)

    def _buckets_upto(self, limit: int) -> list[int]:
        return [n for n in self.profile.node_buckets if n <= limit] or [self.profile.node_buckets[0]]

    def _ar(self, batch: int, reason: str) -> Decision:
        return Decision(1, float(batch), self.profile.decode_time(batch) * self.lambda_decode, reason)


class ExpectedThroughputBudget(BudgetPolicy):
    """Maximise expected tokens per second from drafter confidences (module docstring), with calibration, an
    autoregressive fallback with exponential backoff, and probes that keep the calibration honest."""

    name = "expected"

    def __init__(
        self,
        profile: CostProfile,
        max_nodes: int | None = None,
        calibration_decay: float = 0.8,
        max_backoff: int = 64,
        margin: float = 0.1,
        probe_cost_fraction: float = 0.02,
        drafter: str = "",
    ):
        super().__init__(profile, max_nodes)
        if not (math.isfinite(float(margin)) and float(margin) >= 0):
            raise ValueError(f"margin = {margin!r} must be a finite number >= 0")
        self.drafter = str(drafter)
        if not 0.0 < float(probe_cost_fraction) <= 1.0:
            raise ValueError(f"probe_cost_fraction = {probe_cost_fraction!r} must be in (0, 1]")
        self.probe_cost_fraction = float(probe_cost_fraction)
        self.calibration_decay = float(calibration_decay)
        self.max_backoff = int(max_backoff)
        self.margin = float(margin)
        self.accepted_ema = 0.0
        self.predicted_ema = 0.0
        self.skip_remaining = 0
        self.backoff = 1
        self._probe_due = False
        self.paying_ema = 0.0  # share of the drafts that were verified (moving average over drafted steps)
        self.gain_ema = 0.0  # seconds a verified step saved against decoding its tokens one by one (moving average)
        self._token_seconds = 0.0  # decoding's seconds per token at the last decision
        self._batch = 0  # its batch

    @property
    def kappa(self) -> float:
        """Calibration: accepted / predicted draft tokens (moving averages), at most 2; 1 before any data."""
        if self.predicted_ema <= 0:
            return 1.0
        return float(min(2.0, self.accepted_ema / self.predicted_ema))

    def want_draft(self, batch: int) -> bool:
        """False during a backoff period (autoregressive steps without drafting), and when the drafter's known cost
        (:meth:`CostProfile.draft_time`) makes even the best case lose to decoding (every request accepting as
        many tokens as the deepest draft seen, or the whole tree when no depth is known): then no draft is paid for,
        and the next draft (a probe of the cost) waits until it would cost ``probe_cost_fraction`` of the decoding
        time in between."""
        if self.skip_remaining > 0:
            self.skip_remaining -= 1
            return False
        if self._probe_due:  # the pause for a hopeless draft is over: draft once, measuring its cost again
            self._probe_due = False
            return True
        draft = self.profile.draft_time(self.drafter, batch)
        if draft is None:
            return True
        ar = self._ar(batch, "")
        ar_rate = ar.predicted_tokens / ar.predicted_seconds * (1.0 + self.margin)
        depth = self.profile.draft_max_depth(self.drafter, batch)
        best_case = max(batch * (1 + min(n - 1, n if depth is None else depth))
                        / (self.profile.verify_time(batch, n) * self.lambda_verify + draft)
                        for n in self._buckets_upto(self.draft_size(batch)))
        if best_case > ar_rate:
            return True
        self.skip_remaining = max(0, math.ceil(draft / (self.probe_cost_fraction * ar.predicted_seconds)) - 1)
        self._probe_due = True
        return False

    def best(self, batch: int, confidences: Sequence[np.ndarray], kappa: float) -> Decision:
        """The node bucket of highest expected tokens per second (bucket 1 = autoregressive through verify)."""
        cumulative = cumulative_confidences(confidences)  # [B, M + 1]: sum of the m largest confidences per request
        best: Decision | None = None
        for n in self._buckets_upto(self.max_nodes):
            m = min(n - 1, cumulative.shape[1] - 1)
            tokens = float(len(confidences) + kappa * cumulative[:, m].sum())
            seconds = self.profile.verify_time(batch, n) * self.lambda_verify
            if best is None or tokens / seconds > best.predicted_tokens / best.predicted_seconds:
                best = Decision(n, tokens, seconds, f"expected {tokens / seconds:.4g} tok/s at N = {n}")
        assert best is not None
        return best

    def choose(self, batch: int, confidences: Sequence[np.ndarray], draft_seconds: float) -> Decision:
        """Speculate with the best bucket when it beats decoding (the draft is paid for by now); otherwise decode.

        Whether to *draft* in the next steps is a separate question, answered with the draft's cost included: when
        the drafts that were verified saved more time (moving averages of their share p and of their saving G against
        decoding) than the declined ones cost, ``p G > (1 - p) T_draft``, the next step drafts again; otherwise, when
        ``tokens / (T_draft + T_verify)`` loses to decoding (or decoding wins outright), drafting backs off for 1, 2,
        4, .. steps. When only the calibration stands in the way (the drafter's own confidences would pay), a step
        that decodes runs as a *probe* at the best bucket of the uncalibrated confidences instead, so the calibration
        can recover when the drafts get better; probes happen once per backoff period."""
        ar = self._ar(batch, "autoregressive: no tree bucket beats decode")
        ar_rate = ar.predicted_tokens / ar.predicted_seconds * (1.0 + self.margin)
        spec = self.best(batch, confidences, self.kappa)
        spec_wins = not spec.autoregressive and spec.predicted_tokens / spec.predicted_seconds > ar_rate
        pays_with_draft = spec_wins and (
            spec.predicted_tokens / (spec.predicted_seconds + max(draft_seconds, 0.0)) > ar_rate)
        a = self.calibration_decay
        self.paying_ema = a * self.paying_ema + (1 - a) * float(spec_wins)
        self._token_seconds = ar.predicted_seconds / ar.predicted_tokens  # for observe: decoding's cost of a token
        self._batch = batch
        if pays_with_draft:
            self.backoff = 1
            return spec
        if self.paying_ema * self.gain_ema > (1 - self.paying_ema) * max(draft_seconds, 0.0):
            # the verified drafts saved more than the declined ones cost (a cheap drafter whose matches come and go):
            # draft again next step
            self.skip_remaining = 0
        else:
            # decode without drafting for the backoff period, and at least long enough that a wasted draft of this
            # cost stays below `probe_cost_fraction` of the decoding time in between
            amortize = math.ceil(max(draft_seconds, 0.0) / (self.probe_cost_fraction * ar.predicted_seconds))
            self.skip_remaining = max(self.backoff, min(amortize, 64 * self.max_backoff))
            self.backoff = min(self.max_backoff, 2 * self.backoff)
        if spec_wins:
            spec.reason += f"; drafting ({1e3 * draft_seconds:.2f} ms) does not pay: next {self.skip_remaining} " \
                           "steps decode"
            return spec
        optimistic = self.best(batch, confidences, max(1.0, self.kappa))
        if not optimistic.autoregressive and optimistic.predicted_tokens / optimistic.predicted_seconds > ar_rate:
            optimistic.reason = f"probe (calibration {self.kappa:.2f}); " + optimistic.reason
            return optimistic
        return ar

    def observe(self, decision: Decision, predicted_accepted: float, accepted: float, draft_seconds: float) -> None:
        if decision.autoregressive:
            return
        a = self.calibration_decay
        saved = (self._batch + accepted) * self._token_seconds - decision.predicted_seconds - draft_seconds
        self.gain_ema = a * self.gain_ema + (1 - a) * saved  # decoding these tokens one step each, less this step
        self.accepted_ema = a * self.accepted_ema + (1 - a) * float(accepted)
        self.predicted_ema = a * self.predicted_ema + (1 - a) * float(predicted_accepted)

    def record_draft_time(self, batch: int, seconds: float, depth: int | None = None) -> None:
        """A draft's measured seconds (and its deepest node): into the profile's record for this drafter (the cost of
        *this* draft is sunk when ``choose`` runs; the record decides whether the next ones are worth drafting)."""
        self.last_draft_seconds = float(seconds)
        self.profile.observe_draft(self.drafter, batch, float(seconds), depth)


class RatioRuleBudget(BudgetPolicy):
    """Baseline: the largest node bucket with ``T_verify(B, N) <= (1 + eps) * T_decode(B)``; autoregressive when
    that is N = 1. Confidences are ignored."""

    name = "ratio"

    def __init__(self, profile: CostProfile, eps: float = 0.1, max_nodes: int | None = None):
        super().__init__(profile, max_nodes)
        if not (math.isfinite(eps) and eps >= 0):
            raise ValueError(f"eps = {eps!r} must be a finite number >= 0")
        self.eps = float(eps)

    def _nodes(self, batch: int) -> int:
        limit = (1.0 + self.eps) * self.profile.decode_time(batch)
        fits = [n for n in self._buckets_upto(self.max_nodes) if self.profile.verify_time(batch, n) <= limit]
        return max(fits) if fits else 1

    def draft_size(self, batch: int) -> int:
        return self._nodes(batch)

    def want_draft(self, batch: int) -> bool:
        return self._nodes(batch) > 1

    def choose(self, batch: int, confidences: Sequence[np.ndarray], draft_seconds: float) -> Decision:
        n = self._nodes(batch)
        if n <= 1:
            return self._ar(batch, "ratio rule: no bucket within (1 + eps) x decode")
        tokens = batch_expected_tokens(confidences, n)
        return Decision(n, tokens, self.profile.verify_time(batch, n), f"ratio rule, eps = {self.eps}")


class FixedBudget(BudgetPolicy):
    """Always verify trees cut to ``nodes`` (for sweeps); never falls back."""

    name = "fixed"

    def __init__(self, profile: CostProfile, nodes: int):
        super().__init__(profile, nodes)
        self.nodes = int(nodes)
        if self.nodes < 1:
            raise ValueError(f"nodes = {nodes} must be >= 1")

    def choose(self, batch: int, confidences: Sequence[np.ndarray], draft_seconds: float) -> Decision:
        if self.nodes <= 1:
            return self._ar(batch, "fixed: 1 node")
        tokens = batch_expected_tokens(confidences, self.nodes)
        return Decision(self.nodes, tokens, self.profile.verify_time(batch, self.nodes), f"fixed {self.nodes}")


class AutoregressiveOnly(BudgetPolicy):
    """Never speculate."""

    name = "none"

    def want_draft(self, batch: int) -> bool:
        return False

    def choose(self, batch: int, confidences: Sequence[np.ndarray], draft_seconds: float) -> Decision:
        return self._ar(batch, "autoregressive mode")


BUDGETS = {"expected": ExpectedThroughputBudget, "ratio": RatioRuleBudget, "fixed": FixedBudget}


def make_budget(name: str, profile: CostProfile, **kwargs) -> BudgetPolicy:
    """``"expected"`` | ``"ratio"`` | ``"fixed"`` (needs ``nodes``) | ``"none"``."""
    if name == "none":
        return AutoregressiveOnly(profile)
    if name not in BUDGETS:
        raise ValueError(f"budget = {name!r}; expected one of {sorted(BUDGETS) + ['none']}")
    return BUDGETS[name](profile, **kwargs)


def profile_cache_path(key: dict) -> str:
    """Where the cost profile of the model and device described by ``key`` is cached: ``$LUMOTREE_CACHE`` (default
    ``~/.cache/lumotree``) ``/profiles/<digest of key>.json``."""
    import hashlib

    root = os.environ.get("LUMOTREE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "lumotree")
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:24]
    return os.path.join(root, "profiles", f"{digest}.json")
