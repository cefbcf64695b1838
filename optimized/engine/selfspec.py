r"""Self-speculation: drafts from a subset of the target's own layers, and the acceptance study that goes with it.

Two drafters share the target's embedding, final norm, ``lm_head`` and layer weights (nothing is trained or copied;
each has its own caches):

- ``"layer-skip"`` (LayerSkip early exit): the first ``k`` decoder layers, then the final norm and the head.
- ``"gdn-only"`` (component-aware self-speculation): the Gated DeltaNet decoder layers of the target (each with its
  MLP), the gated-attention layers skipped. On a hybrid it is the linear-time part of the model: its cost per token
  does not grow with the context.

Both grow EAGLE-2 style trees (:class:`~lumotree.optimized.engine.drafters.DraftModelDrafter`); their confidences are
the draft's cumulative probabilities, cut to the budget by confidence pruning like every drafter's.

The acceptance study (:func:`acceptance_study`) measures, for greedy chains of ``k`` draft tokens (``k = 1..4``), the
*acceptance rate* ``alpha(k)`` = accepted draft tokens / drafted tokens and the mean accepted length per step, through
the engine (so the speculative output is checked equal to the autoregressive one), and next to it the
*perplexity-ablation ratio* ``PPL(draft) / PPL(target)`` on the same text (:func:`perplexity_ratio`): a subgraph that
barely changes the target's perplexity drafts well, one that blows it up accepts little, which the ratio tells without
running speculation. Besides the two drafters' subgraphs, the study takes the component-level ablation
(:func:`attention_ablated_tensors`: the attention mixers skipped, every MLP kept).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .drafters import Draft, DraftModelDrafter, DraftRequest, EngineDrafter
from .sampling import SamplingParams, TreeBatch

__all__ = ["SELF_SPECULATION", "self_speculation_layers", "attention_ablated_tensors", "layer_skip_checkpoint",
           "SelfSpeculationDrafter",
           "DraftCounter",
           "sequence_log_probs", "perplexity", "perplexity_ratio", "acceptance_study"]

SELF_SPECULATION = ("layer-skip", "gdn-only")


def self_speculation_layers(config: Any, kind: str, exit_layer: int | None = None) -> list[int]:
    """The target layers a self-speculation draft keeps: ``"layer-skip"``: ``0 .. exit_layer - 1`` (default: the
    first half); ``"gdn-only"``: the Gated DeltaNet layers (``exit_layer`` must be None)."""
    layers = int(config.num_hidden_layers)
    if kind == "layer-skip":
        k = max(1, layers // 2) if exit_layer is None else exit_layer
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= layers:
            raise ValueError(f"exit_layer = {exit_layer!r} must be an integer in [1, {layers}] (the layers kept)")
        return list(range(int(k)))
    if kind == "gdn-only":
        if exit_layer is not None:
            raise ValueError(f"exit_layer = {exit_layer!r} applies to layer-skip only (gdn-only keeps every GDN "
                             "layer)")
        chosen = [i for i, t in enumerate(config.layer_types) if t == "linear_attention"]
        if not chosen:
            raise ValueError("kind = 'gdn-only': the model has no Gated DeltaNet layers")
        if len(chosen) == layers:
            raise ValueError("kind = 'gdn-only': the model has no attention layers (the subgraph is the model)")
        return chosen
    raise ValueError(f"kind = {kind!r} is not one of {SELF_SPECULATION}")


def attention_ablated_tensors(config: Any, tensors: Mapping[str, Any]) -> dict[str, Any]:
    """The target's HF-named tensors with every gated-attention layer's output projection (``self_attn.o_proj``)
    zeroed: the attention sublayers add nothing to the residual stream, every GDN sublayer and every MLP (those of the
    attention layers included) runs. Its outputs are exactly those of the GDN + MLP subgraph with the attention mixers
    skipped, the component-level ablation of the acceptance study; it still computes the attention, so as a drafter
    use ``"gdn-only"`` (whole attention layers dropped). Only the zeroed tensors are new; the rest are the target's
    (numpy arrays or torch tensors alike)."""
    out = dict(tensors)
    for i, kind in enumerate(config.layer_types):
        if kind == "full_attention":
            name = f"model.layers.{i}.self_attn.o_proj.weight"
            out[name] = tensors[name] * 0
    return out


def layer_skip_checkpoint(config: Any, tensors: Mapping[str, Any], layers: Sequence[int]) -> tuple[Any, dict[str, Any]]:
    """The draft model of :func:`lumotree.reference.drafters.layer_skip_draft` at the checkpoint level: the config
    and HF-named tensors of a model made of the target layers ``layers`` (renumbered 0..), with the target's
    embedding, final norm and ``lm_head``. Tensors are passed through, not copied (a model built from tensors that
    already have its device and dtype shares their storage with the target)."""
    from lumotree.reference.drafters import layer_skip_config

    draft_config, chosen = layer_skip_config(config, layers)
    out: dict[str, Any] = {}
    for name, t in tensors.items():
        if name.startswith("model.layers."):
            index, rest = name[len("model.layers."):].split(".", 1)
            if int(index) in chosen:
                out[f"model.layers.{chosen.index(int(index))}.{rest}"] = t
        elif not name.startswith("mtp."):
            out[name] = t
    return draft_config, out


class SelfSpeculationDrafter(DraftModelDrafter):
    """A :class:`DraftModelDrafter` over a subgraph of the target (module docstring): ``model`` is the draft built
    from ``layers`` (e.g. :func:`lumotree.reference.drafters.layer_skip_draft` or
    :func:`layer_skip_checkpoint` with :func:`self_speculation_layers`)."""

    def __init__(self, model: Any, kind: str, layers: Sequence[int] | None = None, top_k: int = 4,
                 max_depth: int = 6):
        if kind not in SELF_SPECULATION:
            raise ValueError(f"kind = {kind!r} is not one of {SELF_SPECULATION}")
        what = {"layer-skip": "early exit after the target's first layers",
                "gdn-only": "the target's Gated DeltaNet layers alone (attention skipped)"}[kind]
        super().__init__(model, top_k=top_k, max_depth=max_depth,
                         description=f"self-speculation: {what}, with its embedding, final norm and head")
        self.name = kind
        self.layers = None if layers is None else [int(i) for i in layers]


class DraftCounter:
    """Wraps a drafter and counts the draft tokens it proposes, each draft cut to the step's node count and the
    request's remaining tokens as the engine cuts it (``drafted``; ``proposals``: drafts; ``verified``: drafts with a
    token left to verify), for acceptance rates."""

    synthetic = False

    def __init__(self, drafter: EngineDrafter):
        self.inner = drafter
        self.name = drafter.name
        self.description = drafter.description
        self.synthetic = bool(getattr(drafter, "synthetic", False))
        self.drafted = 0
        self.proposals = 0
        self.verified = 0  # drafts with at least one token verified

    def admit(self, slot: int, prompt: Sequence[int]) -> None:
        self.inner.admit(slot, prompt)

    def propose(self, requests: Sequence[DraftRequest], max_nodes: int, chain: bool) -> list[Draft]:
        drafts = self.inner.propose(requests, max_nodes, chain)
        for r, d in zip(requests, drafts):
            depth = None if r.remaining is None or d.variant != "deterministic" else max(0, r.remaining - 1)
            tokens = (d.cut(max_nodes, depth) if d.variant == "deterministic" else d).num_nodes - 1
            self.drafted += tokens
            self.verified += tokens > 0
        self.proposals += len(drafts)
        return drafts

    def advance(self, requests: Sequence[DraftRequest], committed: Sequence[Sequence[int]]) -> None:
        self.inner.advance(requests, committed)

    def release(self, slot: int) -> None:
        self.inner.release(slot)


# ------------------------------------------------------------------------------------------------ perplexity
def sequence_log_probs(model: Any, tokens: Sequence[int], slot: int = 0) -> np.ndarray:
    """``log p(tokens[i + 1] | tokens[: i + 1])`` for every i (``[len - 1]``, float64), teacher-forced through a
    :class:`~lumotree.optimized.engine.TargetModel` (any backend): a prefill of the first token, then chains of up to
    ``max_nodes`` tokens verified and committed. The slot is released at the end."""
    seq = [int(t) for t in tokens]
    if len(seq) < 2:
        raise ValueError(f"tokens has {len(seq)} entries: a log-probability needs at least 2")
    if len(seq) > model.max_seq_len:
        raise ValueError(f"tokens has {len(seq)} entries, more than the model's context ({model.max_seq_len})")
    out = []
    logits = model.prefill(slot, seq[:1])  # [V] predicts seq[1]
    out.append(float(torch.log_softmax(logits.double(), -1)[seq[1]]))
    i = 1
    slots = torch.tensor([slot], dtype=torch.int64)
    while i < len(seq) - 1:
        m = min(int(model.max_nodes), len(seq) - 1 - i)  # nodes seq[i .. i + m - 1] predict seq[i + 1 .. i + m]
        width = min(int(model.max_nodes), 1 << max(0, m - 1).bit_length())
        trees = TreeBatch.pack([seq[i:i + m]], [[-1] + list(range(m - 1))], width=width)
        logits = model.verify(slots, trees)[0, :m]  # [m, V]
        nxt = torch.tensor(seq[i + 1:i + m + 1], device=logits.device)
        out.extend(torch.log_softmax(logits.double(), -1).gather(1, nxt[:, None])[:, 0].cpu().tolist())
        model.commit(slots, trees, torch.tensor([m - 1], dtype=torch.int64))
        i += m
    model.release(slot)
    return np.array(out)


def perplexity(model: Any, sequences: Sequence[Sequence[int]], slot: int = 0) -> float:
    """``exp`` of the mean negative log-likelihood of every next token of ``sequences`` (teacher-forced)."""
    if not sequences:
        raise ValueError("sequences is empty")
    logp = np.concatenate([sequence_log_probs(model, s, slot) for s in sequences])
    return float(math.exp(-logp.mean()))


def perplexity_ratio(target: Any, draft: Any, sequences: Sequence[Sequence[int]]) -> dict[str, float]:
    """The perplexity-ablation ratio ``PPL(draft) / PPL(target)`` on ``sequences`` (both models teacher-forced):
    ``{"ppl_target", "ppl_draft", "ppl_ratio"}``."""
    ppl_target, ppl_draft = perplexity(target, sequences), perplexity(draft, sequences)
    return {"ppl_target": ppl_target, "ppl_draft": ppl_draft, "ppl_ratio": ppl_draft / ppl_target}


# ------------------------------------------------------------------------------------------------ study
def acceptance_study(
    target: Any,
    draft: Any,
    prompts: Sequence[Sequence[int]],
    ks: Sequence[int] = (1, 2, 3, 4),
    max_new_tokens: int = 32,
    texts: Sequence[Sequence[int]] | None = None,
) -> dict[str, Any]:
    """Acceptance of greedy chains of ``k`` tokens drafted by ``draft`` (a TargetModel over a subgraph of ``target``)
    for each k in ``ks``, and the perplexity-ablation ratio on ``texts`` (default: each prompt followed by the target's
    greedy continuation). Returns ``{"alpha": {k: accepted / drafted}, "mean_accepted": {k: accepted tokens per
    request-step that verified a drafted token}, "lossless": every speculative output equal to the autoregressive
    one, "ppl_target", "ppl_draft", "ppl_ratio"}``. ``target`` and ``draft`` need as many slots as prompts run at once (the engine
    queues the rest) and a context of ``prompt + max_new_tokens + max(ks) + 1``."""
    from .engine import Engine

    if not prompts:
        raise ValueError("prompts is empty")
    for k in ks:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"ks holds {k!r}: every k must be an integer >= 1")
    params = SamplingParams(max_new_tokens=max_new_tokens)
    reference = [r.tokens for r in Engine(target, mode="autoregressive").generate(prompts, params)]
    result: dict[str, Any] = {"alpha": {}, "mean_accepted": {}, "lossless": True, "ks": [int(k) for k in ks]}
    for k in ks:
        counter = DraftCounter(DraftModelDrafter(draft, top_k=1, max_depth=int(k)))
        engine = Engine(target, counter, mode="chain", budget="fixed", max_nodes=int(k) + 1)
        out = engine.generate(prompts, params)
        result["lossless"] &= [r.tokens for r in out] == reference
        accepted = sum(r.accepted for r in out)
        result["alpha"][int(k)] = accepted / counter.drafted if counter.drafted else 0.0
        result["mean_accepted"][int(k)] = accepted / counter.verified if counter.verified else 0.0
    texts = texts if texts is not None else [list(p) + list(r) for p, r in zip(prompts, reference)]
    result.update(perplexity_ratio(target, draft, texts))
    return result
