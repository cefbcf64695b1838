r"""The gated delta rule for training: fla's chunk kernel on the GPU, a differentiable torch recurrence on the CPU.

For each value head (key heads shared by ``HV / H`` consecutive value heads, as transformers' Qwen3.5 does), with
``q_t, k_t`` L2-normalised and ``q_t`` scaled by ``1 / sqrt(K)``:

.. math::
    S_t = e^{g_t} S_{t-1} + \beta_t k_t (v_t - e^{g_t} S_{t-1}^\top k_t)^\top, \qquad o_t = S_t^\top q_t

with ``S_0 = 0``, ``S_t: [K, V]`` kept in float32. fla (``fla.ops.gated_delta_rule.chunk_gated_delta_rule``) computes
the same function chunk-wise with its own backward; it is imported only when a CUDA tensor asks for it.
"""

from __future__ import annotations

import torch

__all__ = ["gated_delta_rule", "recurrent_gated_delta_rule", "fla_available", "l2_normalize"]


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum x^2 + eps)`` over the last axis (fla's and transformers' form)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def recurrent_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                               beta: torch.Tensor) -> torch.Tensor:
    """The rule token by token (differentiable, float32). ``q, k: [B, T, H, K]``, ``v: [B, T, HV, V]``,
    ``g, beta: [B, T, HV]`` (``g`` the log decay); returns ``o: [B, T, HV, V]`` in ``v``'s dtype."""
    B, T, H, K = k.shape
    HV, V = v.shape[-2:]
    if HV % H:
        raise ValueError(f"v has {HV} heads, not a multiple of the {H} key heads")
    dtype = v.dtype
    q = l2_normalize(q.float()) * K ** -0.5
    k = l2_normalize(k.float())
    if HV != H:  # each key head serves HV / H consecutive value heads
        q, k = q.repeat_interleave(HV // H, dim=2), k.repeat_interleave(HV // H, dim=2)
    v, g, beta = v.float(), g.float(), beta.float()
    state = v.new_zeros(B, HV, K, V)  # [B, HV, K, V]
    outs = []
    for t in range(T):
        state = state * g[:, t].exp()[..., None, None]
        recalled = (state * k[:, t, :, :, None]).sum(dim=-2)  # [B, HV, V]
        delta = (v[:, t] - recalled) * beta[:, t, :, None]  # [B, HV, V]
        state = state + k[:, t, :, :, None] * delta[:, :, None, :]
        outs.append((state * q[:, t, :, :, None]).sum(dim=-2))  # [B, HV, V]
    return torch.stack(outs, dim=1).to(dtype)  # [B, T, HV, V]


def fla_available() -> bool:
    """Whether fla's chunk kernel can be imported (the carried ``fla_core`` wheel)."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # noqa: F401
    except Exception:
        return False
    return True


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     backend: str = "auto") -> torch.Tensor:
    """The rule with the backend's kernel: ``"fla"`` (chunk kernel, CUDA), ``"torch"``
    (:func:`recurrent_gated_delta_rule`) or ``"auto"`` (fla for CUDA tensors, torch otherwise). Shapes as in
    :func:`recurrent_gated_delta_rule`."""
    if backend not in ("auto", "fla", "torch"):
        raise ValueError(f"backend = {backend!r} is not one of 'auto', 'fla', 'torch'")
    if backend == "torch" or (backend == "auto" and not q.is_cuda):
        return recurrent_gated_delta_rule(q, k, v, g, beta)
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as exc:
        raise RuntimeError(f"backend 'fla' needs fla (the fla_core wheel) importable: {exc}") from exc
    o, _ = chunk_gated_delta_rule(q, k, v, g=g.float(), beta=beta, use_qk_l2norm_in_kernel=True,
                                  output_final_state=False)
    return o
