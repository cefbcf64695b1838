"""Torch reference of the routed MoE block (:func:`moe_routed_ref`): transformers' ``Qwen3NextSparseMoeBlock``
expert by expert, in the inputs' dtype (float64 included)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["moe_routed_ref", "route_ref"]


def route_ref(x: torch.Tensor, router: torch.Tensor, top_k: int, norm_topk_prob: bool
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids [T, k] int64, weights [T, k] in x's dtype)``: ``softmax(x router^T)`` in fp32 (or x's dtype if wider),
    the ``top_k`` largest with ties to the lower expert index (a stable sort), renormalised when ``norm_topk_prob``,
    cast to x's dtype (``router`` cast to x's dtype first)."""
    logits = x @ router.to(x.dtype).T  # [T, E] in x's dtype
    probs = torch.softmax(logits.to(torch.promote_types(x.dtype, torch.float32)), dim=-1)  # [T, E]
    ids = torch.sort(probs, dim=-1, descending=True, stable=True).indices[:, :top_k]  # [T, k]
    top = probs.gather(1, ids)  # [T, k]
    if norm_topk_prob:
        top = top / top.sum(-1, keepdim=True)
    return ids, top.to(x.dtype)


def moe_routed_ref(x: torch.Tensor, router: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, *,
                   top_k: int, norm_topk_prob: bool, shared_gate_up: torch.Tensor | None = None,
                   shared_down: torch.Tensor | None = None, shared_gate: torch.Tensor | None = None,
                   route_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``out = sum_j w_j down_e(silu(gate_e x) * up_e x) + sigmoid(shared_gate x) shared(x)`` on ``x: [T, Dm]``
    (routing: :func:`route_ref`; shapes as :func:`~lumotree.optimized.ops.moe.moe_routed`), each expert over the
    tokens routed to it, contributions added in x's dtype. The weights may be of another float dtype: each matrix is
    cast to x's dtype where it is used (a bf16 model checked in fp32 without an fp32 copy of every expert). Reads the
    routing to the host (not graph safe). ``route_dtype``: route ``x`` rounded to this dtype (its logits and router
    weights rounded to it, as a model served in it routes), then compute the experts in x's dtype: a bf16 block
    checked against fp32 math on the same routing (None: x's dtype)."""
    I = w_gate_up.shape[1] // 2
    ids, weights = route_ref(x if route_dtype is None else x.to(route_dtype), router, top_k, norm_topk_prob)
    weights = weights.to(x.dtype)  # [T, k]
    out = torch.zeros_like(x)  # [T, Dm]
    for e in torch.unique(ids).tolist():
        tokens, slots = torch.nonzero(ids == e, as_tuple=True)  # [n], [n]
        gu = x[tokens] @ w_gate_up[e].to(x.dtype).T  # [n, 2I]
        hidden = F.silu(gu[:, :I]) * gu[:, I:]  # [n, I]
        out.index_add_(0, tokens, (hidden @ w_down[e].to(x.dtype).T) * weights[tokens, slots, None])
    if shared_gate_up is not None:
        Is = shared_gate_up.shape[0] // 2
        gu = x @ shared_gate_up.to(x.dtype).T  # [T, 2Is]
        shared = (F.silu(gu[:, :Is]) * gu[:, Is:]) @ shared_down.to(x.dtype).T  # [T, Dm]
        out = out + torch.sigmoid(x @ shared_gate.to(x.dtype).T) * shared
    return out
