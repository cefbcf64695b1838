r"""The gated delta rule for training: fla's chunk kernel on the GPU, a differentiable torch recurrence on the CPU.

For each value head (key heads shared by ``HV / H`` consecutive value heads, as transformers' Qwen3.5 does), with
``q_t, k_t`` L2-normalised and ``q_t`` scaled by ``1 / sqrt(K)``:

.. math::
    S_t = e^{g_t} S_{t-1} + \beta_t k_t (v_t - e^{g_t} S_{t-1}^\top k_t)^\top, \qquad o_t = S_t^\top q_t

with ``S_0 = 0``, ``S_t: [K, V]`` kept in float32. fla (``fla.ops.gated_delta_rule.chunk_gated_delta_rule``) computes
the same function chunk-wise with its own backward; it is imported only when a CUDA tensor asks for it.
:func:`chunked_gated_delta_rule` is the same chunk-wise (WY) form in plain torch (autograd through a unit-triangular
solve per chunk): the ``"chunk"`` backend, and what ``"auto"`` falls back to on CUDA when fla cannot train
(:func:`fla_unusable`).
"""

from __future__ import annotations

import functools

import torch

__all__ = ["gated_delta_rule", "recurrent_gated_delta_rule", "chunked_gated_delta_rule", "fla_available",
           "fla_unusable", "l2_normalize"]


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum x^2 + eps)`` over the last axis (fla's and transformers' form)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _query_keys(q: torch.Tensor, k: torch.Tensor, HV: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``q, k: [B, T, H, K]`` in float32, L2-normalised (``q`` scaled by ``K^-1/2``) and expanded to the ``HV`` value
    heads (each key head serves ``HV / H`` consecutive value heads): ``[B, T, HV, K]`` each."""
    H, K = k.shape[-2:]
    if HV % H:
        raise ValueError(f"v has {HV} heads, not a multiple of the {H} key heads")
    q = l2_normalize(q.float()) * K ** -0.5
    k = l2_normalize(k.float())
    if HV != H:
        q, k = q.repeat_interleave(HV // H, dim=2), k.repeat_interleave(HV // H, dim=2)
    return q, k


def recurrent_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                               beta: torch.Tensor) -> torch.Tensor:
    """The rule token by token (differentiable, float32). ``q, k: [B, T, H, K]``, ``v: [B, T, HV, V]``,
    ``g, beta: [B, T, HV]`` (``g`` the log decay); returns ``o: [B, T, HV, V]`` in ``v``'s dtype."""
    B, T, _, K = k.shape
    HV, V = v.shape[-2:]
    dtype = v.dtype
    q, k = _query_keys(q, k, HV)
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


def chunked_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                             beta: torch.Tensor, chunk: int = 64) -> torch.Tensor:
    r"""The rule chunk by chunk (differentiable, float32), shapes as :func:`recurrent_gated_delta_rule`.

    Within a chunk, with ``G_i`` the cumulative log decay and ``L = strict_lower(diag(beta) K K^T * e^{G_i - G_j})``,
    the WY factors are ``U = (I + L)^{-1} diag(beta) V`` and ``W = (I + L)^{-1} diag(beta e^{G}) K``; then
    ``V' = U - W S``, ``O = e^{G} Q S + lower(Q K^T * e^{G_i - G_j}) V'`` and
    ``S <- e^{G_C} S + (K e^{G_C - G})^T V'``.
    """
    B, T, _, K = k.shape
    HV, V = v.shape[-2:]
    dtype = v.dtype
    q, k = _query_keys(q, k, HV)
    pad = (-T) % chunk
    q, k, v = (torch.nn.functional.pad(x.float(), (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (torch.nn.functional.pad(x.float(), (0, 0, 0, pad)) for x in (g, beta))  # padding: g = beta = 0
    N = (T + pad) // chunk
    q, k, v = (x.transpose(1, 2).reshape(B, HV, N, chunk, -1) for x in (q, k, v))  # [B, HV, N, C, *]
    g, beta = (x.transpose(1, 2).reshape(B, HV, N, chunk) for x in (g, beta))  # [B, HV, N, C]
    G = g.cumsum(-1)
    decay = (G[..., :, None] - G[..., None, :]).tril().exp().tril()  # [B, HV, N, C, C], e^{G_i - G_j} for j <= i
    eye = torch.eye(chunk, device=q.device, dtype=q.dtype)
    strict = torch.ones(chunk, chunk, device=q.device, dtype=torch.bool).tril(-1)
    lower = ((beta[..., None] * k) @ k.transpose(-1, -2) * decay).masked_fill(~strict, 0.0)
    solve = torch.linalg.solve_triangular(eye + lower, torch.cat(
        (beta[..., None] * v, (beta * G.exp())[..., None] * k), dim=-1), upper=False, unitriangular=True)
    u, w = solve[..., :V], solve[..., V:]  # [B, HV, N, C, V], [B, HV, N, C, K]
    state = q.new_zeros(B, HV, K, V)
    outs = []
    causal = torch.ones(chunk, chunk, device=q.device, dtype=torch.bool).tril()
    for n in range(N):
        v_new = u[:, :, n] - w[:, :, n] @ state  # [B, HV, C, V]
        scores = (q[:, :, n] @ k[:, :, n].transpose(-1, -2) * decay[:, :, n]).masked_fill(~causal, 0.0)
        outs.append((q[:, :, n] * G[:, :, n, :, None].exp()) @ state + scores @ v_new)
        last = G[:, :, n, -1]  # [B, HV]
        state = state * last.exp()[..., None, None] + (
            k[:, :, n] * (last[..., None] - G[:, :, n]).exp()[..., None]).transpose(-1, -2) @ v_new
    o = torch.stack(outs, dim=2).reshape(B, HV, N * chunk, V)[:, :, :T]
    return o.transpose(1, 2).to(dtype)  # [B, T, HV, V]


@functools.cache
def fla_unusable() -> str | None:
    """Why fla's chunk kernel cannot train here (``None`` when it can): not importable (the carried ``fla_core``
    wheel), or fla's own refusal of its gated backward on Hopper with Triton >= 3.4 and < 3.7.1, whose results
    fla reports as incorrect. Checked once a process."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # noqa: F401
    except Exception:
        return "fla not importable"
    try:
        from fla.utils import IS_NVIDIA_HOPPER, TRITON_ABOVE_3_4_0, TRITON_ABOVE_3_7_1
    except ImportError:  # a version of fla without the refusal
        return None
    if IS_NVIDIA_HOPPER and TRITON_ABOVE_3_4_0 and not TRITON_ABOVE_3_7_1:
        return "fla refuses its gated backward on Hopper with this Triton"
    return None


def fla_available() -> bool:
    """Whether fla's chunk kernel can train here (:func:`fla_unusable` gives the reason when not)."""
    return fla_unusable() is None


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                     backend: str = "auto") -> torch.Tensor:
    """The rule with the backend's kernel: ``"fla"`` (chunk kernel, CUDA), ``"torch"``
    (:func:`recurrent_gated_delta_rule`), ``"chunk"`` (:func:`chunked_gated_delta_rule`) or ``"auto"`` (fla for
    CUDA tensors, the chunked torch form there when fla cannot train (:func:`fla_unusable`), the recurrence on the
    CPU). Shapes as in :func:`recurrent_gated_delta_rule`."""
    if backend not in ("auto", "fla", "torch", "chunk"):
        raise ValueError(f"backend = {backend!r} is not one of 'auto', 'fla', 'torch', 'chunk'")
    if backend == "torch" or (backend == "auto" and not q.is_cuda):
        return recurrent_gated_delta_rule(q, k, v, g, beta)
    if backend == "chunk" or (backend == "auto" and not fla_available()):
        return chunked_gated_delta_rule(q, k, v, g, beta)
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as exc:
        raise RuntimeError(f"backend 'fla' needs fla (the fla_core wheel) importable: {exc}") from exc
    if k.shape[2] != v.shape[2]:  # each key head serves HV / H consecutive value heads, spelled out for the kernel
        q, k = (x.repeat_interleave(v.shape[2] // k.shape[2], dim=2) for x in (q, k))
    o, _ = chunk_gated_delta_rule(q, k, v, g=g.float(), beta=beta, use_qk_l2norm_in_kernel=True,
                                  output_final_state=False)
    return o
