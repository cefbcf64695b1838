r"""The EAGLE drafter: a one-layer head trained on the target's own outputs (:mod:`lumotree.reference.eagle`,
``lumotree train eagle``) drafts dynamic trees from the target's hidden states.

The head is laid out and aligned like the checkpoint MTP head, so the drafter is the MTP drafter's machinery
(:class:`~lumotree.optimized.engine.mtp.MTPDrafter`: per-request head caches fed from the target's hidden states,
features fed back at deeper levels) on the EAGLE weights: the reference backend runs the exact float64 head
(:class:`~lumotree.reference.eagle.EagleHead`), the optimized backend the model's attention and MLP kernels on the
head's own KV pools (:class:`~lumotree.optimized.model.mtp.MTPHead` over the EAGLE weights).

Trees grow as EAGLE-2 grows them: each round expands the ``top_k`` frontier nodes of highest cumulative probability
with their ``top_k`` most probable children; after ``depth`` rounds the pool is reranked by path confidence and cut to
the budget's N (confidence pruning). *Calibrated* confidences: a node's conditional probability under the head
``q = P(t_u | path)`` is mapped through the head's calibration (the monotone map from head probability to the rate
at which the target agrees, measured on held-out text after training and stored in the head's ``config.json``), and
the path confidence is the product of the calibrated conditionals along the path, what the budget sums as expected
accepted tokens.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .drafters import Draft, DraftRequest
from .mtp import MTPDrafter
from .targets import OptimizedTarget, ReferenceMTPHead, ReferenceTarget

__all__ = ["EagleDrafter", "ReferenceEagleHead", "optimized_eagle_head", "calibrated_confidences"]


class ReferenceEagleHead(ReferenceMTPHead):
    """The exact EAGLE head (float64) behind the slot-addressed head protocol of
    :class:`~lumotree.optimized.engine.targets.ReferenceMTPHead`."""

    def __init__(self, model: Any, eagle: str | os.PathLike, num_slots: int, max_nodes: int):
        from lumotree.reference.eagle import EagleHead

        self.head = EagleHead(model, eagle)
        self.eagle_config = self.head.eagle_config
        self.num_slots, self.max_nodes = int(num_slots), int(max_nodes)
        self.hidden_size = int(model.config.hidden_size)
        self.device, self.dtype = torch.device("cpu"), torch.float64
        self.caches: dict[int, Any] = {}


class _WithWeights:
    """An optimized model seen with other weights (everything else is the model's): the EAGLE head's host."""

    def __init__(self, model: Any, weights: Any):
        self._model = model
        self.weights = weights

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def optimized_eagle_head(model: Any, eagle: str | os.PathLike) -> tuple[Any, dict]:
    """``(head, eagle config)``: the EAGLE head of the folder ``eagle`` on an
    :class:`~lumotree.optimized.model.OptimizedModel`'s device and kernels (its hidden states kept from now on)."""
    from dataclasses import replace

    from lumotree.reference.eagle import eagle_tensor_shapes, eagle_weights, read_eagle

    from ..model.mtp import MTPHead
    from ..model.weights import AttentionLayerWeights, MLPWeights, MTPWeights
    from ..ops.gemv import interleave_gate_up

    config, tensors = read_eagle(eagle)
    inner = int(config["intermediate_size"])
    if int(config.get("hidden_size", -1)) != model.config.hidden_size:
        raise ValueError(f"eagle = {str(eagle)!r}: hidden_size {config.get('hidden_size')} is not the target's "
                         f"{model.config.hidden_size}")
    eagle_weights(model.config, tensors, inner)  # names, shapes, finiteness
    assert set(tensors) == set(eagle_tensor_shapes(model.config, inner))
    dev, dtype, f32 = model.device, model.dtype, torch.float32

    def get(name: str, as_dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.from_numpy(tensors[name]).to(device=dev, dtype=as_dtype or dtype).contiguous()

    p = "eagle.layers.0"
    a = f"{p}.self_attn"
    layer = AttentionLayerWeights(1.0 + get(f"{p}.input_layernorm.weight", f32),
                                  torch.cat([get(f"{a}.q_proj.weight"), get(f"{a}.k_proj.weight"),
                                             get(f"{a}.v_proj.weight")]).contiguous(),
                                  get(f"{a}.q_norm.weight", f32), get(f"{a}.k_norm.weight", f32),
                                  get(f"{a}.o_proj.weight"))
    mlp = MLPWeights(1.0 + get(f"{p}.post_attention_layernorm.weight", f32),
                     interleave_gate_up(get(f"{p}.mlp.gate_proj.weight"), get(f"{p}.mlp.up_proj.weight")),
                     get(f"{p}.mlp.down_proj.weight"))
    weights = MTPWeights(get("eagle.fc.weight"), 1.0 + get("eagle.pre_fc_norm_embedding.weight", f32),
                         1.0 + get("eagle.pre_fc_norm_hidden.weight", f32), [layer], [mlp],
                         1.0 + get("eagle.norm.weight", f32))
    par = model.parallel
    if par.active:  # this rank's heads and columns, as the model's
        from ..parallel import shard_head

        spec = model.config.attention_spec()  # the whole model's heads (model.weights holds this rank's)
        weights = shard_head(weights, (spec.num_heads, spec.num_kv_heads, spec.head_dim), par.rank, par.world)
    head = MTPHead(_WithWeights(model, replace(model.weights, mtp=weights)))
    model.keep_hidden_states(True)
    return head, config


def calibrated_confidences(parents: Sequence[int], confidence: np.ndarray, calibration: dict | None) -> np.ndarray:
    """Path confidences through a calibration map (module docstring): ``c'(u) = c'(parent) * g(c(u) / c(parent))``
    with ``g`` the step function ``calibration["values"]`` on ``calibration["edges"]`` (None: unchanged)."""
    conf = np.asarray(confidence, dtype=np.float64)
    if calibration is None:
        return conf
    edges = np.asarray(calibration["edges"], dtype=np.float64)
    values = np.asarray(calibration["values"], dtype=np.float64)
    out = np.ones_like(conf)
    for u in range(1, len(conf)):
        parent = parents[u]
        q = conf[u] / conf[parent] if conf[parent] > 0 else 0.0
        g = values[min(int(np.searchsorted(edges, q, side="right")) - 1, len(values) - 1)]
        out[u] = out[parent] * float(np.clip(g, np.finfo(np.float64).tiny, 1.0))
    return out


class EagleDrafter(MTPDrafter):
    """Drafts with a trained EAGLE head (module docstring). ``target``: the engine's target
    (:class:`~lumotree.optimized.engine.ReferenceTarget` or :class:`~lumotree.optimized.engine.OptimizedTarget`);
    ``eagle``: the head's folder; ``depth``: tree rounds; ``top_k``: frontier width and children per node;
    ``calibrated``: map confidences through the head's calibration."""

    name = "eagle"
    synthetic = False

    def __init__(self, target: Any, eagle: str | os.PathLike, depth: int = 4, top_k: int = 4,
                 calibrated: bool = True):
        for name, value in (("depth", depth), ("top_k", top_k)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} = {value!r} must be an integer >= 1")
        if isinstance(target, ReferenceTarget):
            self.head = ReferenceEagleHead(target.model, eagle, target.num_slots, target.max_nodes)
            config = self.head.eagle_config
        elif isinstance(target, OptimizedTarget):
            self.head, config = optimized_eagle_head(target.model, eagle)
        else:
            raise TypeError(f"target {type(target).__name__}: the EAGLE drafter runs on ReferenceTarget or "
                            "OptimizedTarget")
        self.target = target
        self.depth, self.top_k, self.sampled = depth, top_k, False
        self.calibration = config.get("calibration") if calibrated else None
        self.description = (f"EAGLE head trained on the target's outputs ({os.fspath(eagle)}): depth {depth}, top-k "
                            f"{top_k}, {'calibrated' if self.calibration else 'raw'} confidences")
        self._root: dict[int, torch.Tensor] = {}
        self._tokens: dict[int, list[int]] = {}
        self._hidden: dict[int, list[torch.Tensor]] = {}

    def propose(self, requests: Sequence[DraftRequest], max_nodes: int, chain: bool) -> list[Draft]:
        drafts = super().propose(requests, max_nodes, chain)
        if self.calibration is None:
            return drafts
        return [Draft(d.tokens, d.parents, calibrated_confidences(d.parents, d.confidence, self.calibration))
                .cut(max_nodes) for d in drafts]
