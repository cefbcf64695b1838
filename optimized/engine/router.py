r"""The payoff-predicting router (Hybrid Verified Decoding): per step and request, the cache draft (suffix decoding),
the model drafter's draft, or their merged tree, whichever promises the most accepted tokens per unit of verify cost.

**Payoff.** A draft's *payoff* is its accepted length: the draft tokens the target accepts. Before verifying, the
router predicts it from the draft's features (:func:`draft_features`): its match length (cache drafts), the sum of
its confidences (their expected accepted length if calibrated), its top first-token confidence, its node count and
depth, the request's position in its output, and the request's recent accepted length (an exponential average). The
predictor is a :class:`PayoffModel` per source (cache, model): a linear regression fitted offline by ridge least
squares on recorded drafts (``lumotree train router``: engine runs on the training workloads with the recorder on)
and updated online by recursive least squares with forgetting after every step (each draft's true payoff is known
once the target's next tokens are: the walk of the draft tree along them).

**Choice.** With ``cost(n)`` the verify time of an ``n``-node tree at the step's batch size (the budget's
:class:`~lumotree.optimized.engine.budget.CostProfile`; without one, ``1 + node_cost * n`` decode steps), a source's
rate is ``(1 + payoff) / cost``. The cache draft is free; the model draft costs ``model_cost`` more (its measured
drafting time per step, or the relative default). Each request:

1. drafts from the cache and predicts its payoff ``a_c``;
2. compares ``(1 + a_c) / cost(n_c)`` with the model's expected rate ``(1 + a_m) / (cost(n_m) + model_cost)``, where
   ``a_m`` and ``n_m`` are the request's last model draft's predicted payoff and size (at first 1 token and 4
   nodes: the model is tried early); if the cache wins, the model drafter is not run;
3. else the model drafter drafts (batched over these requests) and the router predicts its payoff; the merged tree
   (:func:`merge_drafts`: the union trie, each node's confidence the larger of the two sources' after scaling each
   tree's confidences to its predicted payoff) has payoff the sum of its confidences; the best of cache, model and
   merged by ``(1 + payoff) / cost`` is proposed (the model's drafting time is spent by then).

The proposed draft's confidences are scaled to its predicted payoff, so the engine's budget sums consistent numbers.
Every draft is an ordinary deterministic draft: the router is lossless through the engine like any drafter.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .drafters import Draft, DraftRequest, EngineDrafter
from .suffix import SuffixDrafter

__all__ = ["FEATURES", "SOURCES", "draft_features", "accepted_length", "PayoffModel", "merge_drafts",
           "scaled_confidences", "RouterDrafter", "fit_payoff_models", "load_router", "save_router"]

FEATURES = ("bias", "match_len", "log_match_len", "confidence_sum", "top_confidence", "log_nodes", "depth",
            "log_position", "recent_accepted", "recent_x_confidence")
SOURCES = ("cache", "model")


def draft_features(draft: Draft, match_len: int, position: int, recent: float) -> np.ndarray:
    """The feature vector (:data:`FEATURES`) of a draft: ``match_len`` (0 for model drafts), ``position`` (output
    tokens so far), ``recent`` (the request's recent accepted length)."""
    conf = draft.confidence[1:]
    depth = max(draft.depth()) if draft.num_nodes > 1 else 0
    first = [c for c, p in zip(conf, draft.parents[1:]) if p == 0]
    total = float(conf.sum())
    return np.array([1.0, match_len / 8.0, math.log1p(match_len), total, max(first, default=0.0),
                     math.log1p(draft.num_nodes - 1), depth / 8.0, math.log1p(position) / 8.0, recent,
                     recent * total], dtype=np.float64)


def accepted_length(tokens: Sequence[int], parents: Sequence[int], truth: Sequence[int]) -> int:
    """The draft tokens a target whose next tokens are ``truth`` accepts from the tree (root ``tokens[0]``): the
    longest root path whose tokens are ``truth``'s prefix."""
    children: dict[tuple[int, int], int] = {}
    for i in range(1, len(tokens)):
        children.setdefault((parents[i], int(tokens[i])), i)
    node, n = 0, 0
    for tok in truth:
        node = children.get((node, int(tok)), -1)
        if node < 0:
            break
        n += 1
    return n


class PayoffModel:
    """Linear payoff ``max(0, w . x)`` over :data:`FEATURES`; :meth:`fit`: ridge least squares, :meth:`update`:
    recursive least squares with forgetting factor ``forgetting`` (``P`` the inverse information matrix).

    RLS step for ``(x, y)``: ``k = P x / (lambda + x^T P x)``, ``w += k (y - w . x)``, ``P = (P - k x^T P) /
    lambda``."""

    def __init__(self, weights: Sequence[float] | None = None, ridge: float = 1.0, forgetting: float = 0.995,
                 prior_scale: float = 10.0):
        if not ridge > 0:
            raise ValueError(f"ridge = {ridge!r} must be > 0")
        if not 0 < forgetting <= 1:
            raise ValueError(f"forgetting = {forgetting!r} must lie in (0, 1]")
        dim = len(FEATURES)
        self.w = np.zeros(dim) if weights is None else np.asarray(weights, dtype=np.float64).copy()
        if self.w.shape != (dim,):
            raise ValueError(f"weights has {self.w.size} entries, expected {dim} (FEATURES)")
        self.ridge, self.forgetting = float(ridge), float(forgetting)
        self.P = np.eye(dim) * prior_scale  # [F, F]
        self.updates = 0

    def predict(self, x: np.ndarray) -> float:
        return max(0.0, float(self.w @ x))

    def update(self, x: np.ndarray, y: float) -> None:
        Px = self.P @ x  # [F]
        k = Px / (self.forgetting + float(x @ Px))
        self.w = self.w + k * (float(y) - float(self.w @ x))
        self.P = (self.P - np.outer(k, Px)) / self.forgetting
        self.P = (self.P + self.P.T) / 2  # stays symmetric in floating point
        self.updates += 1

    def fit(self, X: np.ndarray, y: np.ndarray) -> PayoffModel:
        X, y = np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64)  # [n, F], [n]
        if X.ndim != 2 or X.shape[1] != len(FEATURES) or y.shape != (X.shape[0],):
            raise ValueError(f"X has shape {X.shape} and y {y.shape}; expected [n, {len(FEATURES)}] and [n]")
        A = X.T @ X + self.ridge * np.eye(X.shape[1])
        self.w = np.linalg.solve(A, X.T @ y)
        self.P = np.linalg.inv(A)
        return self

    def to_dict(self) -> dict:
        return {"weights": self.w.tolist(), "ridge": self.ridge, "forgetting": self.forgetting}

    @classmethod
    def from_dict(cls, d: dict) -> PayoffModel:
        return cls(d["weights"], d.get("ridge", 1.0), d.get("forgetting", 0.995))


#: payoff models before any fit: the cache payoff is its (frequency) confidence sum, the model's its confidence sum
DEFAULT_WEIGHTS = {"cache": [0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
                   "model": [0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]}


def scaled_confidences(draft: Draft, payoff: float) -> np.ndarray:
    """The draft's confidences scaled so they sum to ``payoff`` (each capped at 1, the root kept at 1)."""
    conf = draft.confidence.copy()
    total = float(conf[1:].sum())
    if total > 0:
        conf[1:] = np.minimum(conf[1:] * (payoff / total), 1.0)
    return conf


def merge_drafts(a: Draft, conf_a: np.ndarray, b: Draft, conf_b: np.ndarray) -> Draft:
    """The union trie of two drafts with one root token; a node in both keeps the larger confidence."""
    if a.tokens[0] != b.tokens[0]:
        raise ValueError("the drafts have different roots")
    tokens, parents, conf = [a.tokens[0]], [-1], [1.0]
    index: dict[tuple[int, int], int] = {}
    for draft, c in ((a, conf_a), (b, conf_b)):
        mapped = [0] * draft.num_nodes
        for i in range(1, draft.num_nodes):
            key = (mapped[draft.parents[i]], int(draft.tokens[i]))
            if key not in index:
                index[key] = len(tokens)
                tokens.append(int(draft.tokens[i]))
                parents.append(key[0])
                conf.append(0.0)
            mapped[i] = index[key]
            conf[mapped[i]] = max(conf[mapped[i]], float(c[i]))
    return Draft(tokens, parents, np.array(conf))


class RouterDrafter:
    """The router (module docstring) over a :class:`~lumotree.optimized.engine.suffix.SuffixDrafter` (``cache``) and
    any model drafter (``model``: EAGLE, MTP, a draft model). ``models``: payoff models by source (default: confidence
    sums); ``profile``: the budget's cost profile (set by the engine's owner; None: relative costs ``1 + node_cost *
    n`` and ``model_cost``); ``online``: RLS updates after every step; ``record``: keep every resolved draft's
    ``(source, features, payoff)`` in ``records``; ``explore``: draft from both sources every step (recording runs:
    both get a label)."""

    name = "router"
    synthetic = False

    def __init__(self, cache: SuffixDrafter, model: EngineDrafter, models: dict[str, PayoffModel] | None = None,
                 profile: Any = None, online: bool = True, record: bool = False, explore: bool = False,
                 node_cost: float = 0.01, model_cost: float = 0.3, recent_decay: float = 0.7):
        if not 0 <= recent_decay < 1:
            raise ValueError(f"recent_decay = {recent_decay!r} must lie in [0, 1)")
        if not (node_cost >= 0 and model_cost >= 0):
            raise ValueError("node_cost and model_cost must be >= 0")
        self.cache, self.model = cache, model
        self.models = models or {s: PayoffModel(DEFAULT_WEIGHTS[s]) for s in SOURCES}
        if set(self.models) != set(SOURCES):
            raise ValueError(f"models has sources {sorted(self.models)}, expected {list(SOURCES)}")
        self.profile, self.online, self.record, self.explore = profile, online, record, explore
        self.node_cost, self.model_cost, self.recent_decay = float(node_cost), float(model_cost), recent_decay
        self.description = f"router: suffix cache drafts or {model.name} drafts by predicted payoff per verify cost"
        self.records: list[tuple[str, np.ndarray, int]] = []
        self.picks = {"cache": 0, "model": 0, "merged": 0}
        self.errors: list[tuple[str, float, int]] = []  # (source, predicted, measured) of chosen drafts
        self._recent: dict[int, float] = {}
        self._model_payoff: dict[int, float] = {}
        self._model_nodes: dict[int, int] = {}
        self._pending: dict[int, list[tuple[str, np.ndarray, Draft, float, bool]]] = {}
        self._truth: dict[int, list[int]] = {}
        self._model_seconds: float | None = None

    # ------------------------------------------------------------------------------------------------ requests
    def admit(self, slot: int, prompt: Sequence[int]) -> None:
        self.cache.admit(slot, prompt)
        self.model.admit(slot, prompt)
        self._recent[slot] = 0.0
        self._model_payoff[slot] = 1.0  # optimistic: the model is tried early
        self._model_nodes[slot] = 4
        self._pending.pop(slot, None)
        self._truth.pop(slot, None)

    def release(self, slot: int) -> None:
        self.cache.release(slot)
        self.model.release(slot)
        for state in (self._recent, self._model_payoff, self._model_nodes, self._pending, self._truth):
            state.pop(slot, None)

    def advance(self, requests: Sequence[DraftRequest], committed: Sequence[Sequence[int]]) -> None:
        self.cache.advance(requests, committed)
        self.model.advance(requests, committed)
        for r, new in zip(requests, committed):
            if r.slot in self._pending:
                self._truth[r.slot] = [int(t) for t in new[1:]]  # the accepted tokens; the bonus one comes next

    def _resolve(self, r: DraftRequest) -> None:
        """The last step's drafts of this request meet the target's tokens (accepted + the new pending one)."""
        pending, truth = self._pending.pop(r.slot, None), self._truth.pop(r.slot, None)
        if pending is None or truth is None:
            return
        truth = truth + [int(r.context[-1])]
        best = None
        for source, x, draft, predicted, chosen in pending:
            y = accepted_length(draft.tokens, draft.parents, truth)
            if self.online:
                self.models[source].update(x, y)
            if self.record:
                self.records.append((source, x, y))
            if chosen:
                self.errors.append((source, predicted, y))
                best = y if best is None else max(best, y)
        if best is not None:
            self._recent[r.slot] = self.recent_decay * self._recent[r.slot] + (1 - self.recent_decay) * best

    # ------------------------------------------------------------------------------------------------ costs
    def cost(self, batch: int, nodes: int) -> float:
        """Verify cost of an ``nodes``-node tree at ``batch`` (seconds from the profile, else relative)."""
        if self.profile is not None:
            return float(self.profile.verify_time(batch, max(1, nodes)))
        return 1.0 + self.node_cost * nodes

    def model_draft_cost(self, batch: int) -> float:
        if self.profile is not None:
            return self._model_seconds if self._model_seconds is not None else \
                self.model_cost * float(self.profile.decode_time(batch))
        return self.model_cost

    def choose(self, batch: int, options: dict[str, tuple[float, int]], model_pending: bool) -> str:
        """The source of the highest ``(1 + payoff) / cost``: ``options`` maps a source to ``(payoff, nodes)``;
        ``model_pending``: the model drafts have not been drawn (their drafting cost is still to pay)."""
        best, best_rate = "", -1.0
        for source, (payoff, nodes) in options.items():
            extra = self.model_draft_cost(batch) if model_pending and source != "cache" else 0.0
            rate = (1.0 + payoff) / (self.cost(batch, nodes) + extra)
            if rate > best_rate + 1e-12:
                best, best_rate = source, rate
        return best

    # ------------------------------------------------------------------------------------------------ drafts
    def propose(self, requests: Sequence[DraftRequest], max_nodes: int, chain: bool) -> list[Draft]:
        B = len(requests)
        for r in requests:
            self._resolve(r)
        limit = max_nodes - 1 if self.cache.max_spec_tokens is None else min(max_nodes - 1, self.cache.max_spec_tokens)
        cache_drafts, cache_x, cache_pay = [], [], []
        for r in requests:
            c = self.cache.candidate(r.slot, r.context, limit, chain) if limit > 0 else None
            d = Draft([int(r.context[-1])] + (c.tokens if c else []), [-1] + [p + 1 for p in (c.parents if c else [])],
                      np.array([1.0] + (c.probs if c else [])), best_first=True)
            x = draft_features(d, c.match_len if c and c.tokens else 0, len(r.context), self._recent[r.slot])
            cache_drafts.append(d)
            cache_x.append(x)
            cache_pay.append(self.models["cache"].predict(x) if d.num_nodes > 1 else 0.0)
        want = []
        for b, r in enumerate(requests):
            guess = self._model_payoff[r.slot]
            n_guess = min(max_nodes, self._model_nodes[r.slot])
            pick = self.choose(B, {"cache": (cache_pay[b], cache_drafts[b].num_nodes), "model": (guess, n_guess)},
                               model_pending=True)
            if self.explore or pick == "model":
                want.append(b)
        model_drafts: dict[int, Draft] = {}
        if want:
            start = time.perf_counter()
            drawn = self.model.propose([requests[b] for b in want], max_nodes, chain)
            seconds = time.perf_counter() - start
            self._model_seconds = seconds if self._model_seconds is None else 0.8 * self._model_seconds + 0.2 * seconds
            model_drafts = dict(zip(want, drawn))
        out = []
        for b, r in enumerate(requests):
            pending = [("cache", cache_x[b], cache_drafts[b], cache_pay[b])]
            options = {"cache": (cache_pay[b], cache_drafts[b].num_nodes)}
            drafts = {"cache": (cache_drafts[b], scaled_confidences(cache_drafts[b], cache_pay[b]))}
            if b in model_drafts:
                m = model_drafts[b]
                x = draft_features(m, 0, len(r.context), self._recent[r.slot])
                pay = self.models["model"].predict(x) if m.num_nodes > 1 else 0.0
                self._model_payoff[r.slot] = pay
                self._model_nodes[r.slot] = m.num_nodes
                pending.append(("model", x, m, pay))
                options["model"] = (pay, m.num_nodes)
                drafts["model"] = (m, scaled_confidences(m, pay))
                if not chain and cache_drafts[b].num_nodes > 1 and m.num_nodes > 1:
                    merged = merge_drafts(cache_drafts[b], drafts["cache"][1], m, drafts["model"][1])
                    merged = merged.cut(max_nodes)
                    options["merged"] = (float(merged.confidence[1:].sum()), merged.num_nodes)
                    drafts["merged"] = (merged, merged.confidence)
            pick = self.choose(B, options, model_pending=False)
            self.picks[pick] += 1
            draft, conf = drafts[pick]
            self._pending[r.slot] = [(s, x, d, p, s == pick or (pick == "merged")) for s, x, d, p in pending]
            out.append(Draft(draft.tokens, draft.parents, conf).cut(max_nodes))
        return out

    def summary(self) -> dict:
        """Picks per source and the payoff models' mean absolute error on the chosen drafts so far."""
        err = {s: [abs(p - y) for src, p, y in self.errors if src == s] for s in SOURCES}
        return {"picks": dict(self.picks),
                "mae": {s: (float(np.mean(v)) if v else None) for s, v in err.items()},
                "drafts_scored": len(self.errors)}


# ------------------------------------------------------------------------------------------------ fitting
def fit_payoff_models(records: Sequence[tuple[str, np.ndarray, int]], ridge: float = 1.0
                      ) -> tuple[dict[str, PayoffModel], dict[str, float | None]]:
    """Ridge fits per source of recorded ``(source, features, payoff)``; returns the models and each one's in-sample
    mean absolute error (None: no records of that source; the default model is kept)."""
    models, mae = {}, {}
    for source in SOURCES:
        rows = [(x, y) for s, x, y in records if s == source]
        model = PayoffModel(DEFAULT_WEIGHTS[source], ridge=ridge)
        if rows:
            X = np.stack([x for x, _ in rows])  # [n, F]
            y = np.array([y for _, y in rows], dtype=np.float64)  # [n]
            model.fit(X, y)
            mae[source] = float(np.mean(np.abs(np.maximum(X @ model.w, 0.0) - y)))
        else:
            mae[source] = None
        models[source] = model
    return models, mae


def save_router(models: dict[str, PayoffModel], path: str | Path, extra: dict | None = None) -> Path:
    path = Path(path)
    path.write_text(json.dumps({"format": "lumotree-router", "features": list(FEATURES),
                                "models": {s: m.to_dict() for s, m in models.items()}, **(extra or {})}, indent=1)
                    + "\n")
    return path


def load_router(path: str | Path) -> dict[str, PayoffModel]:
    """The payoff models of a file :func:`save_router` wrote (features checked)."""
    data = json.loads(Path(path).read_text())
    if data.get("format") != "lumotree-router" or list(data.get("features", [])) != list(FEATURES):
        raise ValueError(f"router = {str(path)!r} is not a payoff-model file of these features ({len(FEATURES)})")
    return {s: PayoffModel.from_dict(data["models"][s]) for s in SOURCES}
