r"""The portable GDN tree verify (any CUDA GPU, and the Triton interpreter): the split pipeline (solve, then apply)
or the one-kernel form, picked per shape by :func:`~lumotree.optimized.ops.gdn_tree.config.verify_config`.

:func:`portable_verify` computes, for a batch of requests each with its own tree (up to 128 nodes, sizes may
differ), every node's output and the token-level factors from the committed state ``S0`` read once, without forming
a per-node state::

    Delta = (I + A)^{-1} diag(beta) (V - diag(Gamma) K S0)
    O     = scale (diag(Gamma) Q S0 + (Q K^T ⊙ D) Delta)

Layouts as flash-linear-attention: ``q, k: [B, N, H, K]``, ``v: [B, N, HV, V]``, ``g, beta: [B, N, HV]``; fp32 state
pool ``[P, HV, K, V]`` addressed by ``slots: [B]``. With ``A_log`` and ``dt_bias`` the gates come raw (``a``,
``b``) and are computed in the kernels.
"""

from __future__ import annotations

import torch

from ..checks import (FLOAT_DTYPES, MAX_NODES, check_finite_nodes, check_range_nodes, check_scalar, check_sizes,
                      check_slots, check_tensor, check_tree_rows, node_mask)
from ..pdl import pdl_supported
from ..tree_meta import WORD_BITS, TreeMeta, check_meta, tree_metadata
from .apply import _gdn_tree_apply_kernel, _gdn_tree_verify_kernel
from .common import (GATE_PIECE, OutputGate, TreeFactors, check_precision, pow2_dim,
                     tma_descriptors)
from .config import (KernelConfig, check_config, fused_constants, padded_nodes, solve_constants, tile_constants,
                     use_row_halves, verify_config)
from .solve import _gdn_tree_solve_kernel, _gdn_tree_solve_rows_kernel

__all__ = ["portable_verify"]


def _check_gate(gate: object, B: int, N: int, HV: int, V: int, device: torch.device) -> None:
    if not isinstance(gate, OutputGate):
        raise TypeError(f"gate must be an OutputGate or None, got {type(gate).__name__}")
    check_tensor("gate.z", gate.z, (B, N, HV, V), "B, N, HV, V", FLOAT_DTYPES, device)
    check_tensor("gate.weight", gate.weight, (V,), "V", FLOAT_DTYPES, device, contiguous=True)
    check_tensor("gate.parts", gate.parts, (B, N, HV, V // GATE_PIECE), f"B, N, HV, V / {GATE_PIECE}",
                 (torch.float32,), device, contiguous=True)


def _verify_descriptors(enabled: bool, state_pool, q, k, v, o, delta, NP: int, block_k: int, block_v: int,
                        **scratch) -> dict:
    """The verify kernels' descriptors (:func:`_tma_descriptors`): the pool's ``[BK, BV]`` state tiles (the pool as
    ``[P HV K, V]`` rows), q / k / v / o / delta ``[1, NP, 1, B*]`` node tiles of their ``[B, N, H*, *]`` tensors and
    the split pipeline's ``[NP, NP]`` scratch tiles (``scratch``: name -> ``[B HV, NP, NP]`` tensor)."""
    V = state_pool.shape[-1]
    tile = [1, NP, 1]
    tensors = dict(pool=state_pool.view(-1, V), q=q, k=k, v=v, o=o, delta=delta,
                   **{name: t.view(-1, NP) for name, t in scratch.items()})
    blocks = dict(pool=[block_k, block_v], q=[*tile, block_k], k=[*tile, block_k], v=[*tile, block_v],
                  o=[*tile, block_v], delta=[*tile, block_v], **{name: [NP, NP] for name in scratch})
    return tma_descriptors(tensors, blocks, enabled)


def portable_verify(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state_pool: torch.Tensor,
    slots: torch.Tensor,
    parents: torch.Tensor,
    *,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    allow_neg_eigval: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    scale: float | None = None,
    num_nodes: torch.Tensor | None = None,
    input_precision: str = "ieee",
    meta: TreeMeta | None = None,
    validate: bool = True,
    out: tuple | None = None,
    gate: OutputGate | None = None,
    config: KernelConfig | None = None,
    pdl: bool = False,
    launch_dependents: bool = False,
) -> tuple[torch.Tensor, TreeFactors]:
    """Verify a batch of draft trees on one GDN layer; returns ``(o, factors)``, the pool untouched.

    ``q, k: [B, N, H, K]``, ``v: [B, N, HV, V]`` (fp32, bf16 or fp16, last dim contiguous), ``g`` (log decay, <= 0)
    and ``beta`` (in [0, 2]): ``[B, N, HV]``; with ``A_log, dt_bias: [HV]`` given, ``g`` and ``beta`` are the raw
    projections ``a`` and ``b`` and the gates are computed in the kernels (``g = -exp(A_log) softplus(a +
    dt_bias)``, ``beta = sigmoid(b)``, twice that with ``allow_neg_eigval``). ``state_pool: [P, HV, K, V]`` fp32,
    read at ``slots: [B]``; ``parents: [B, N]``; ``num_nodes: [B]`` for trees smaller than N (padding written as
    zeros). ``o: [B, N, HV, V]`` in v's dtype, ``o_i = scale S_i^T q_i``. ``input_precision``: ``"ieee"``,
    ``"tf32x3"`` or ``"tf32"``. ``meta``: this step's :func:`~lumotree.optimized.ops.tree_meta.tree_metadata`.
    ``validate=False`` skips the checks that read data back to the host. ``out``: preallocated ``(o, delta,
    log_gamma, k_rnorm)``. ``gate``: an :class:`~lumotree.optimized.ops.gdn_tree.common.OutputGate` (``o`` then
    holds the gated output before its per-head norm factor). ``config``: launch parameters (default
    :func:`~lumotree.optimized.ops.gdn_tree.config.verify_config`); ``pdl``: the one-kernel form may be a
    programmatic dependent launch where the config asks for one; ``launch_dependents``: the last kernel lets a
    PDL-launched successor (the commit) launch at its start.
    """
    gated = A_log is not None or dt_bias is not None
    gate_a, gate_b = g, beta
    names = ("a", "b") if gated else ("g", "beta")
    device = q.device if isinstance(q, torch.Tensor) else torch.device("cpu")
    check_tensor("q", q, (None, None, None, None), "B, N, H, K", FLOAT_DTYPES, device)
    B, N, H, K = q.shape
    check_tensor("k", k, (B, N, H, K), "B, N, H, K", (q.dtype,), device)
    check_tensor("v", v, (B, N, None, None), "B, N, HV, V", (q.dtype,), device)
    HV, V = v.shape[2], v.shape[3]
    if HV % H != 0:
        raise ValueError(f"v has HV = {HV} value heads, not a multiple of H = {H} q/k heads (GVA)")
    pow2_dim("K (q.shape[3])", K)
    pow2_dim("V (v.shape[3])", V)
    gate_dtypes = (torch.float32, q.dtype)
    check_tensor(names[0], gate_a, (B, N, HV), "B, N, HV", gate_dtypes, device, last_contiguous=False)
    check_tensor(names[1], gate_b, (B, N, HV), "B, N, HV", gate_dtypes, device, last_contiguous=False)
    if gated:
        check_tensor("A_log", A_log, (HV,), "HV", (torch.float32, q.dtype), device, contiguous=True)
        check_tensor("dt_bias", dt_bias, (HV,), "HV", (torch.float32, q.dtype), device, contiguous=True)
    check_tensor("state_pool", state_pool, (None, HV, K, V), "P, HV, K, V", (torch.float32,), device, contiguous=True)
    check_tensor("parents", parents, (B, N), "B, N", (torch.int32, torch.int64), device)
    if N > MAX_NODES:
        raise ValueError(f"parents has N = {N} nodes per request; the kernels support at most {MAX_NODES}")
    slots = check_slots(slots, B, state_pool.shape[0], device, validate, distinct=False)
    has_num = num_nodes is not None  # else every tree has N nodes: the kernels read no sizes
    num_nodes = check_sizes(num_nodes, B, N, device, validate)
    scale = K**-0.5 if scale is None else check_scalar("scale", scale)
    precision = check_precision(input_precision)
    if meta is not None:
        meta = check_meta(meta, B, N, device)
    if out is not None:
        if not isinstance(out, tuple) or len(out) != 4:
            raise TypeError("out must be a tuple (o, delta, log_gamma, k_rnorm)")
        check_tensor("out[0] (o)", out[0], (B, N, HV, V), "B, N, HV, V", (v.dtype,), device, contiguous=True)
        check_tensor("out[1] (delta)", out[1], (B, N, HV, V), "B, N, HV, V", (torch.float32,), device, contiguous=True)
        check_tensor("out[2] (log_gamma)", out[2], (B, N, HV), "B, N, HV", (torch.float32,), device, contiguous=True)
        if use_qk_l2norm_in_kernel:
            check_tensor("out[3] (k_rnorm)", out[3], (B, N, H), "B, N, H", (torch.float32,), device, contiguous=True)
    if gate is not None:
        _check_gate(gate, B, N, HV, V, device)
    if validate:
        check_tree_rows(parents, num_nodes)
        real = node_mask(num_nodes, N)  # [B, N]
        for name, t in (("q", q), ("k", k), ("v", v), (names[0], gate_a), (names[1], gate_b)):
            if gated or name != "g":  # a log decay of -inf (a decay of 0) is taken: the kernels floor it
                check_finite_nodes(name, t, real)
        if gated:
            check_finite_nodes("A_log", A_log[None, None], None)
            check_finite_nodes("dt_bias", dt_bias[None, None], None)
        else:
            check_range_nodes("g", gate_a, float("-inf"), 0.0, real)
            check_range_nodes("beta", gate_b, 0.0, 2.0, real)
        check_finite_nodes("state_pool[slots]", state_pool[slots.long()][None], None)
    if meta is None:
        meta = tree_metadata(parents, num_nodes=num_nodes if has_num else None, validate=False)
    sizes = dict(HAS_NUM=has_num)
    num_nodes = num_nodes if has_num else slots  # an unused int pointer without sizes
    cfg = config or verify_config(B, HV, N, K, V, device, H, precision, q.dtype)
    check_config(cfg)
    signal = bool(launch_dependents) and bool(cfg.early_signal) and pdl_supported(device)

    if out is None:
        o = torch.empty((B, N, HV, V), dtype=v.dtype, device=device)  # [B, N, HV, V]
        delta = torch.empty((B, N, HV, V), dtype=torch.float32, device=device)  # [B, N, HV, V]
        log_gamma = torch.empty((B, N, HV), dtype=torch.float32, device=device)  # [B, N, HV]
        k_rnorm = torch.empty((B, N, H), dtype=torch.float32, device=device) if use_qk_l2norm_in_kernel else None
    else:
        o, delta, log_gamma, k_rnorm = out
        k_rnorm = k_rnorm if use_qk_l2norm_in_kernel else None
    qk16 = q.dtype in (torch.bfloat16, torch.float16)  # tf32-exact q / k: no rounding, |k|^2 from K K^T
    if cfg.solve_heads < 1 or (HV // H) % cfg.solve_heads != 0:
        raise ValueError(f"config.solve_heads = {cfg.solve_heads} must divide HV // H = {HV // H} "
                         "(value heads per q/k head)")
    if cfg.row_halves and cfg.solve_heads != 1:
        raise ValueError(f"config.row_halves takes one value head per solve program, not solve_heads = "
                         f"{cfg.solve_heads}")
    NP = padded_nodes(N)
    block_v = min(cfg.block_v, V)
    block_k = min(cfg.block_k, K)
    gate_strides = (gate_a.stride(0), gate_a.stride(1), gate_a.stride(2),
                    gate_b.stride(0), gate_b.stride(1), gate_b.stride(2))
    qk_strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2))
    k_rnorm_arg = k_rnorm if k_rnorm is not None else log_gamma  # an unused pointer when not normalising
    if gate is not None and block_v % GATE_PIECE:
        raise ValueError(f"config.block_v = {cfg.block_v} must be a multiple of {GATE_PIECE} for an output gate")
    gate_args = (gate.z, gate.weight, gate.parts) if gate is not None else (o, o, log_gamma)  # unused without a gate
    z_strides = (gate.z.stride(0), gate.z.stride(1), gate.z.stride(2)) if gate is not None else (0, 0, 0)
    gate_flags = dict(GATE=gate is not None, PIECE=GATE_PIECE)
    flags = dict(GATED=gated, BETA_TWO=bool(allow_neg_eigval), L2NORM=bool(use_qk_l2norm_in_kernel),
                 PRECISION=precision, WORD_VECTORS=bool(cfg.word_vectors), QK16=qk16)
    gram_flags = dict(DOT16=qk16 and precision != "ieee" and bool(cfg.dot16))
    if cfg.split:
        q_rnorm = torch.empty((B, NP, H), dtype=torch.float32, device=device)  # [B, NP, H]
        scratch16 = bool(cfg.scratch16) and precision == "tf32" and bool(use_qk_l2norm_in_kernel)  # bounded
        scratch = torch.float16 if scratch16 else torch.float32
        tb = torch.empty((B * HV, NP, NP), dtype=scratch, device=device)  # [B*HV, NP, NP] (I + A)^-1 diag(beta)
        qkd = torch.empty((B * HV, NP, NP), dtype=scratch, device=device)  # [B*HV, NP, NP] Q K^T ⊙ D
        solve_flags = solve_constants(cfg, NP)  # noqa: F841 (used below)
        apply_pdl = bool(cfg.apply_pdl) and pdl_supported(device)
        descs = _verify_descriptors(bool(cfg.tma or cfg.solve_tma), state_pool, q, k, v, o, delta, NP, block_k,
                                    block_v, tb=tb, qkd=qkd)
        solve_args = (q, k, gate_a, gate_b, A_log if gated else gate_a, dt_bias if gated else gate_a,
                      meta.words, meta.depth, num_nodes, log_gamma, k_rnorm_arg, q_rnorm, tb, qkd)
        solve_consts = dict(H=H, HV=HV, K=K, W=meta.words.shape[2], **tile_constants(NP), BK=block_k,
                            WORD_BITS=WORD_BITS, num_warps=cfg.solve_warps,
                            num_stages=cfg.solve_stages or cfg.num_stages, PDL=apply_pdl, SCRATCH16=scratch16,
                            **flags, **gram_flags, **sizes,
                            **({"maxnreg": cfg.solve_max_registers} if cfg.solve_max_registers else {}))
        if use_row_halves(cfg, NP):
            ready = torch.zeros((B * HV,), dtype=torch.int32, device=device)  # [B*HV] the upper halves' flags
            c_lower = torch.empty((B * HV, NP // 2, NP // 2), dtype=torch.float32, device=device)  # C per value head
            solve_consts.pop("WORD_VECTORS")
            _gdn_tree_solve_rows_kernel[(B * HV * 2,)](*solve_args, ready, c_lower, N, *qk_strides, *gate_strides,
                                                       **solve_consts)
        else:
            _gdn_tree_solve_kernel[(B * HV // cfg.solve_heads,)](
                *solve_args, N, *qk_strides, *gate_strides, HEADS=cfg.solve_heads, **solve_consts, **solve_flags,
                q_desc=descs["q_desc"] if cfg.solve_tma else None, k_desc=descs["k_desc"] if cfg.solve_tma else None,
                TMA=bool(cfg.solve_tma) and descs["q_desc"] is not None,
            )
        _gdn_tree_apply_kernel[(V // block_v, B * HV)](
            q, k, v, state_pool, slots, num_nodes, log_gamma, k_rnorm_arg, q_rnorm, tb, qkd, o, delta, *gate_args,
            scale, N, *qk_strides, v.stride(0), v.stride(1), v.stride(2), *z_strides,
            H=H, HV=HV, K=K, V=V, NP=NP, BK=block_k, BV=block_v, L2NORM=bool(use_qk_l2norm_in_kernel),
            PRECISION=precision, QK16=qk16, PDL=apply_pdl, SIGNAL=signal, SCRATCH16=scratch16,
            **(descs if cfg.tma else {n: None for n in descs}), TMA=bool(cfg.tma) and descs["pool_desc"] is not None,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **gate_flags, **sizes,
            **({"launch_pdl": True} if apply_pdl else {}),
            **({"maxnreg": cfg.max_registers} if cfg.max_registers else {}),
        )
    else:
        pdl = bool(pdl) and bool(cfg.pdl) and pdl_supported(device)
        descs = _verify_descriptors(bool(cfg.tma), state_pool, q, k, v, o, delta, NP, block_k, block_v)
        _gdn_tree_verify_kernel[(B * HV, V // block_v)](
            q, k, v, gate_a, gate_b, A_log if gated else gate_a, dt_bias if gated else gate_a,
            state_pool, slots, meta.words, meta.depth, num_nodes,
            o, delta, log_gamma, k_rnorm_arg, *gate_args, scale, N,
            *qk_strides, v.stride(0), v.stride(1), v.stride(2), *gate_strides, *z_strides,
            H=H, HV=HV, K=K, V=V, W=meta.words.shape[2], **tile_constants(NP), BK=block_k,
            BV=block_v, WORD_BITS=WORD_BITS, PDL=pdl, STATE_LINES=max(1, block_v * 4 // 128), SIGNAL=signal,
            **fused_constants(cfg, NP), **descs, TMA=descs["pool_desc"] is not None,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **flags, **gram_flags, **gate_flags, **sizes,
            **({"launch_pdl": True} if pdl else {}),
        )
    return o, TreeFactors(delta, log_gamma, k, k_rnorm)
