"""Host side of the small-batch GEMV (:mod:`~lumotree.optimized.ops.gemv`): launch rules, argument checks, the
split-K scratch and the public calls :func:`small_batch_linear` and :func:`residual_linear`."""

from __future__ import annotations

import torch
import triton

from ..checks import (FLOAT_DTYPES, check_num_nodes, check_slots, check_tensor, check_tree_rows, interpreting,
                      tma_possible)
from ..pdl import pdl_supported
from .fp8 import FP8_BLOCK_K, Fp8Weight
from .kernels import (MAX_NORM_PARTS, MAX_ROWS, MAX_SUM_ROWS, OUT_DTYPES, WIDE_N, ConvStep, GemvConfig,
                      ResidualRows, RowNorm, TreeConv, _gemv_kernel)

__all__ = ["gemv_config", "small_batch_linear", "residual_linear", "split_k_scratch", "split_k_scratch_cache",
           "preferred", "interleave_gate_up"]

#: PDL launches of up to this many rows signal the next kernel before their wait, larger ones after it (signalling
#: after the wait made the tree steps' chains of GEMVs faster, and the one-row decode step slower)
EARLY_TRIGGER_MAX_ROWS = 8


_SCRATCH: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def split_k_scratch_cache() -> dict[tuple, tuple[torch.Tensor, torch.Tensor]]:
    """Every cached split-K scratch by ``(device type, device index, M, N, block_n, split_k)``: ``(partials,
    counters)`` (the counters are zero between launches)."""
    return dict(_SCRATCH)


def split_k_scratch(device: torch.device, M: int, N: int, block_n: int, split_k: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The cached ``(partials [split_k, M, N] fp32, counters [cdiv(N, block_n)] int32)`` of one launch shape;
    counters start at zero and every launch leaves them at zero."""
    device = torch.device(device)
    key = (device.type, device.index, M, N, block_n, split_k)
    if key not in _SCRATCH:
        partials = torch.empty((split_k, M, N), dtype=torch.float32, device=device)  # [S, M, N]
        counters = torch.zeros((triton.cdiv(N, block_n),), dtype=torch.int32, device=device)  # [row blocks]
        _SCRATCH[key] = (partials, counters)
    return _SCRATCH[key]


def gemv_config(M: int, N: int, K: int, device: torch.device | str) -> GemvConfig:
    """Default launch for ``x: [M, K] @ w[N, K].T``: the best of an H200 sweep (``bench/gemv.py``, bf16, the bench
    model's projections), by output width:

    - M = 1: broadcast + ``tl.sum``, 4 warps, 1 stage: ``[8, 512]`` tiles for N >= 65536 (the LM head: 140 against
      155 us); the rest from a sweep of the fused forms the decode step runs (same card):
      ``[4, 1024]`` unsplit for N <= 4096 and K <= 4096 (``[2048, 4096]`` adding
      into the residual: 6.8 against 8.3 us for the first rule's ``[4, 512]`` split in 3), ``[4, 512]`` split in 4
      above (the SwiGLU down projection ``[2048, 5632]``: 11.1 against 11.6 us), ``[32, 256]`` at 8 warps in between
      (``[11264, 2048]`` with the norm factor: 13.5 against 14.5 us for ``[16, 256]``);
    - M = 2..8: ``tl.dot`` on ``[64, 128]`` tiles, 4 warps, 4 stages, K split in 8 for N <= 4096 and ``[64, 128]``
      for N >= 65536, ``[32, 128]`` unsplit in between (ties with cuBLAS there);
    - M = 9..64 (``--rows 16 32 64``): for N >= :data:`WIDE_N` ``[128, 128]`` tiles at 3 stages up to 32
      rows, ``[64, 64]`` at 5 stages above (LM head 145-162 against cuBLAS's 160-187 us); else (``--rows 64
      --row-sweep --pdl``, with the unrolled split-K reduction) ``[64, 128]`` at 4
      warps, 4 stages, K split in 4 for N <= 4096 (``[2048, 4096]`` 9.1 against cuBLAS's 10.3 us, ``[2048, 5632]``
      10.6 against 12.0) and ``[64, 64]`` unsplit at 5 stages above (0.92-1.03x cuBLAS).

    ``split_k`` is reduced to whole, non-empty K tiles; the tile's K to the problem's below 512 columns.
    """
    device = torch.device(device)
    warps, use_dot = 4, True
    if M <= 1:
        use_dot, num_stages = False, 1
        if N <= 4096:
            block_n, block_k, split_k = (4, 1024, 1) if K <= 4096 else (4, 512, 4)
        elif N >= WIDE_N:
            block_n, block_k, split_k = 8, 512, 1
        else:
            (block_n, block_k, split_k), warps = (32, 256, 1), 8
    elif M <= MAX_SUM_ROWS:
        num_stages = 4
        block_n, block_k, split_k = (64, 128, 8) if N <= 4096 else (64, 128, 1) if N >= WIDE_N else (32, 128, 1)
    elif N >= WIDE_N:  # 9..64 rows (tree steps, batched decode)
        (block_n, block_k, num_stages), split_k = ((128, 128, 3) if M <= 32 else (64, 64, 5)), 1
    elif N <= 4096:
        block_n, block_k, num_stages, split_k = 64, 128, 4, 4
    else:
        block_n, block_k, num_stages, split_k = 64, 64, 5, 1
    block_k = min(block_k, max(16, triton.next_power_of_2(K)))
    split_k, _ = _split_k_range(K, block_k, split_k)
    return GemvConfig(block_n, block_k, split_k, warps, num_stages, use_dot)


def interleave_gate_up(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's weights ``gate, up: [I, K]`` as one ``[2I, K]`` weight with rows ``2j = gate_j``, ``2j + 1 = up_j``
    (the layout ``swiglu=True`` reads; ``x @ w.T`` then holds the pairs side by side). Two
    :class:`~lumotree.optimized.ops.gemv.fp8.Fp8Weight` give one, each row keeping its own scales."""
    if isinstance(gate, Fp8Weight) and isinstance(up, Fp8Weight) and gate.shape == up.shape:
        rows = torch.stack([gate.scale_rows, up.scale_rows + gate.scale.shape[-2]], dim=-1).flatten()  # [2I]
        lead, (inner, K) = gate.shape[:-2], gate.shape[-2:]
        weight = torch.stack([gate.weight, up.weight], dim=-2).reshape(*lead, 2 * inner, K).contiguous()
        return Fp8Weight(weight, torch.cat([gate.scale, up.scale], dim=-2).contiguous(), rows.contiguous())
    if not (isinstance(gate, torch.Tensor) and isinstance(up, torch.Tensor)) or gate.ndim != 2 \
            or gate.shape != up.shape:
        raise ValueError("gate and up must be tensors of one shape [I, K]")
    return torch.stack([gate, up], dim=1).reshape(2 * gate.shape[0], gate.shape[1]).contiguous()  # [2I, K]


def preferred(M: int, N: int) -> bool:
    """Whether a model step with ``M`` token rows should run its ``N``-output projections here rather than on
    cuBLAS: every shape up to :data:`MAX_ROWS` rows. Up to 8 rows (decode) every bench shape measured at least as
    fast as cuBLAS (``bench/gemv.py``); from 9 to 64 rows (tree steps) single projections range from 0.87x
    (``[9216, 2048]``) to 1.16x cuBLAS, and whole tree steps are faster because the residual add + RMSNorm and the
    tree conv then live in the GEMVs (H200, whole-model verify N = 16 / 32 / 64 at B = 1 in 1700 / 1971 / 2089 us
    against 1886 / 2025 / 2254 with cuBLAS)."""
    return 1 <= M <= MAX_ROWS and N >= 1


def _split_k_range(K: int, block_k: int, split_k: int) -> tuple[int, int]:
    """``(splits, K per split)``: at most ``split_k`` K-ranges of whole ``block_k`` tiles, none of them empty."""
    k_tiles = triton.cdiv(K, block_k)
    tiles_per_split = triton.cdiv(k_tiles, max(1, min(split_k, k_tiles)))
    return triton.cdiv(k_tiles, tiles_per_split), tiles_per_split * block_k


def _is_pow2(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1 and v & (v - 1) == 0


def _check_config(config: object) -> GemvConfig:
    if not isinstance(config, GemvConfig):
        raise TypeError(f"config must be a GemvConfig or None, got {type(config).__name__}")
    for name in ("block_n", "block_k", "num_warps"):
        if not _is_pow2(getattr(config, name)):
            raise ValueError(f"config.{name} = {getattr(config, name)!r} must be a power of two")
    for name in ("split_k", "num_stages"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"config.{name} = {value!r} must be a positive int")
    if config.num_warps > 32:
        raise ValueError(f"config.num_warps = {config.num_warps} must be at most 32")
    if config.use_dot and (config.block_n < 16 or config.block_k < 16):
        raise ValueError(f"config.use_dot needs block_n, block_k >= 16, got {config.block_n}, {config.block_k}")
    if config.tma and not config.use_dot:
        raise ValueError("config.tma needs config.use_dot (the descriptors feed the tl.dot form)")
    if config.tma and max(config.block_n, config.block_k) > 256:
        raise ValueError(f"config.tma: a descriptor block is at most 256 per dimension, got {config.block_n} x "
                         f"{config.block_k}")
    return config


def _check_form(config: GemvConfig, M: int) -> None:
    if not config.use_dot and M > MAX_SUM_ROWS:
        raise ValueError(f"x has {M} rows: the broadcast + sum form (config.use_dot=False) takes at most "
                         f"{MAX_SUM_ROWS}; use a tl.dot config")


def small_batch_linear(x: torch.Tensor, w: torch.Tensor, *, out_dtype: torch.dtype | None = None,
                       config: GemvConfig | None = None, pdl: bool = False, swiglu: bool = False,
                       norm: RowNorm | None = None, conv: ConvStep | TreeConv | None = None, validate: bool = True,
                       out: torch.Tensor | None = None) -> torch.Tensor:
    """``y = x @ w.T`` for a few rows: ``x: [M, K]`` (1 <= M <= 64, contiguous last dim), ``w: [N, K]`` contiguous,
    same float dtype and device; fp32 accumulation; returns ``y: [M, N]`` in ``out_dtype`` (None: x's dtype).
    ``config`` (a :class:`GemvConfig`) overrides :func:`gemv_config`'s default launch. ``pdl`` (GPUs of compute
    capability 9 or more; ignored elsewhere): a programmatic dependent launch, whose programs are resident and
    waiting when the previous kernel ends (:mod:`~lumotree.optimized.ops.pdl`; -3 % on the decode step, H200).
    ``swiglu``: ``w: [2I, K]`` is SwiGLU's gate and up weights with their rows interleaved
    (:func:`interleave_gate_up`) and ``y: [M, I] = silu(x @ w_gate.T) * (x @ w_up.T)``, computed in the epilogue with
    the rounding of a plain GEMV followed by the SwiGLU kernel (one launch and one round trip less; no ``conv``).
    ``norm`` (a :class:`RowNorm`): ``y[m] = (x[m] @ w.T) rsqrt(sum(norm.parts[m]) / K + norm.eps)`` before the
    rounding; with ``x = round(h * g)`` and the parts of :func:`residual_linear` that is ``RMSNorm(h) @ w.T``.
    Per-segment parts ``[M, S, R]`` scale each segment's share of the product instead (:class:`RowNorm`).
    ``conv`` (a :class:`ConvStep`): the first ``C`` columns of ``y`` are then (as rounded) the input of one step of a
    depthwise causal conv, replaced by its output, its state advanced in place in the epilogue of the program that
    owns the columns (one launch less than the GEMV + :func:`~lumotree.optimized.ops.gdn_decode.conv_step`, the same
    values); one K split. ``conv`` (a :class:`TreeConv`, rows = the nodes of a tree step): the first ``C`` columns
    of ``y`` are kept and also go through the tree-window conv into ``conv.out`` (one launch less than the GEMV +
    :func:`~lumotree.optimized.ops.conv_tree.tree_conv`, the same values); one K split. ``validate``: check the slots'
    (and the trees') values (reads them to the host; off in graph capture).
    ``out``: a contiguous ``[M, N]`` (``swiglu``: ``[M, N / 2]``) tensor of the output dtype to write ``y`` into
    (returned)."""
    x, w, K, cfg, out_dtype = _check_linear(x, w, out_dtype, config)
    n_out = w.shape[0]
    if swiglu:
        if n_out % 2:
            raise ValueError(f"w has {n_out} rows: with swiglu it interleaves gate and up rows, an even number")
        if conv is not None:
            raise ValueError("swiglu and conv cannot be combined: the conv reads the plain product")
        n_out //= 2
    if norm is not None:
        cfg = _check_norm(norm, x.shape[0], K, cfg, config is None, x.device)
    if conv is not None:
        conv = _check_conv(conv, x.shape[0], w.shape[0], x.device, validate)
        cfg = cfg._replace(split_k=1)  # the conv needs the block's whole sum
    if out is None:
        y = torch.empty((x.shape[0], n_out), dtype=out_dtype or x.dtype, device=x.device)  # [M, N or N / 2]
    else:
        y = check_tensor("out", out, (x.shape[0], n_out), "M, N / 2 (swiglu)" if swiglu else "M, N",
                         (out_dtype or x.dtype,), x.device, contiguous=True)
        if y.untyped_storage().data_ptr() in (x.untyped_storage().data_ptr(), _weight(w).untyped_storage().data_ptr()):
            raise ValueError("out shares memory with x or w: the programs reading them would race with its stores")
    if isinstance(conv, TreeConv):
        if conv.out.dtype != y.dtype:
            raise TypeError(f"conv.out has dtype {conv.out.dtype}, expected y's {y.dtype}")
        if conv.out.untyped_storage().data_ptr() in (y.untyped_storage().data_ptr(), x.untyped_storage().data_ptr()):
            raise ValueError("conv.out shares memory with y or x: the conv reads them while it stores")
    if isinstance(w, Fp8Weight) and w.tail is not None:  # FP8 rows, then the float rows, into their columns
        n1 = w.weight.shape[0]
        if swiglu:
            raise ValueError("swiglu takes an Fp8Weight without a float tail (interleaved gate / up rows)")
        if conv is not None and conv.weight.shape[0] > n1:
            raise ValueError(f"conv.weight has C = {conv.weight.shape[0]} channels, more than w's {n1} FP8 rows")
        _launch(x, w.head, y[:, :n1], cfg, pdl, False, norm, None, None, conv)
        tail_cfg = gemv_config(x.shape[0], w.tail.shape[0], K, x.device) if config is None else cfg
        if norm is not None:
            tail_cfg = _check_norm(norm, x.shape[0], K, tail_cfg, config is None, x.device)
        _launch(x, w.tail, y[:, n1:], tail_cfg, pdl, False, norm, None, None, None)
        return y
    _launch(x, w, y, cfg, pdl, swiglu, norm, None, None, conv)
    return y


def residual_linear(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor, *, scale: torch.Tensor | None = None,
                    norm: RowNorm | None = None, config: GemvConfig | None = None, pdl: bool = False
                    ) -> ResidualRows:
    """``residual += x @ w.T`` in place, for a few rows (``x: [M, K]``, ``w: [N, K]``, ``residual: [M, N]``
    contiguous, one dtype): ``residual = round(residual + round(x @ w.T))``, the rounding of a separate GEMV followed
    by an add in fp32. Returns :class:`ResidualRows`: the new rows' sums
    of squares in pieces and, with ``scale: [N]`` fp32 (an RMSNorm's weight), ``scaled = round(residual * scale)``;
    ``small_batch_linear(scaled, w2, norm=RowNorm(parts, eps))`` is then ``RMSNorm(residual) @ w2.T``: the residual
    add + RMSNorm between two projections costs no launch of its own (module docstring). ``norm``: the product
    scaled as in :func:`small_batch_linear` before the add."""
    x, w, K, cfg, _ = _check_linear(x, w, None, config)
    if isinstance(w, Fp8Weight) and w.tail is not None:
        raise ValueError("residual_linear takes an Fp8Weight without a float tail")
    M, N = x.shape[0], w.shape[0]
    if norm is not None:
        cfg = _check_norm(norm, M, K, cfg, config is None, x.device)
    check_tensor("residual", residual, (M, N), "M, N", (x.dtype,), x.device, contiguous=True)
    if residual.untyped_storage().data_ptr() in (x.untyped_storage().data_ptr(),
                                                 _weight(w).untyped_storage().data_ptr()):
        raise ValueError("residual shares memory with x or w: the programs reading them would race with its update")
    scaled = None
    if scale is not None:
        check_tensor("scale", scale, (N,), "N", (torch.float32,), x.device, contiguous=True)
        scaled = torch.empty_like(residual)  # [M, N]
    parts = torch.empty((M, triton.cdiv(N, cfg.block_n)), dtype=torch.float32, device=x.device)  # [M, R]
    if parts.shape[1] > MAX_NORM_PARTS:
        raise ValueError(f"w has {N} rows: {parts.shape[1]} row blocks of {cfg.block_n} exceed the {MAX_NORM_PARTS} "
                         "pieces a norm reads")
    _launch(x, w, residual, cfg, pdl, False, norm, parts, (scale, scaled) if scale is not None else None, None)
    return ResidualRows(parts, scaled)


def _check_linear(x, w, out_dtype, config) -> tuple[torch.Tensor, torch.Tensor, int, GemvConfig, object]:
    """The shared argument checks: ``(x, w, K, launch config, out_dtype)``."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    device = x.device
    check_tensor("x", x, (None, None), "M, K", FLOAT_DTYPES, device)
    M, K = x.shape
    if not 1 <= M <= MAX_ROWS:
        raise ValueError(f"x has {M} rows; small_batch_linear takes 1 to {MAX_ROWS} (use a matmul for more)")
    if K < 1:
        raise ValueError("x has K = 0 columns")
    fp8 = isinstance(w, Fp8Weight)
    if fp8:
        check_tensor("w.weight", w.weight, (None, K), "N, K", (torch.float8_e4m3fn,), device, contiguous=True)
        check_tensor("w.scale", w.scale, (None, triton.cdiv(K, FP8_BLOCK_K)), "R, cdiv(K, 128)", (torch.float32,),
                     device, contiguous=True)
        check_tensor("w.scale_rows", w.scale_rows, (w.weight.shape[0],), "N", (torch.int32,), device, contiguous=True)
        if w.tail is not None:
            check_tensor("w.tail", w.tail, (None, K), "N2, K", (x.dtype,), device, contiguous=True)
    else:
        check_tensor("w", w, (None, K), "N, K", (x.dtype,), device, contiguous=True)
    N = w.shape[0]
    if N < 1:
        raise ValueError("w has N = 0 rows")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be one of None, bfloat16, float16, float32, got {out_dtype!r}")
    cfg = gemv_config(M, N, K, device) if config is None else _check_config(config)
    if fp8 and config is None and not cfg.use_dot:  # the same bytes per weight tile as the float default
        cfg = cfg._replace(block_n=cfg.block_n * 2)
    if fp8 and cfg.use_dot:  # one scale per row and tile
        cfg = cfg._replace(block_k=min(cfg.block_k, FP8_BLOCK_K))
    if fp8 and cfg.tma:
        raise ValueError("config.tma: a block-FP8 weight is read by per-thread loads (tma=False)")
    _check_form(cfg, M)
    return x, w, K, cfg, out_dtype


def _check_norm(norm: object, M: int, K: int, cfg: GemvConfig, default: bool, device: torch.device) -> GemvConfig:
    """Checks ``norm``; returns the launch config, whose K tiles a per-segment norm fits inside one segment when it
    is the ``default`` one (``block_k`` halved until it divides the segment)."""
    if not isinstance(norm, RowNorm):
        raise TypeError(f"norm must be a RowNorm or None, got {type(norm).__name__}")
    segmented = isinstance(norm.parts, torch.Tensor) and norm.parts.ndim == 3
    shape, names = ((M, None, None), "M, S, R") if segmented else ((M, None), "M, R")
    parts = check_tensor("norm.parts", norm.parts, shape, names, (torch.float32,), device, contiguous=True)
    if not 1 <= parts.shape[-1] <= MAX_NORM_PARTS:
        raise ValueError(f"norm.parts has {parts.shape[-1]} pieces per row, expected 1 to {MAX_NORM_PARTS}")
    if segmented:
        S = parts.shape[1]
        if S < 1 or K % S:
            raise ValueError(f"norm.parts has S = {S} segments, which do not divide x's K = {K} columns")
        seg = K // S
        if default:
            block_k = cfg.block_k
            while seg % block_k and block_k > 16:
                block_k //= 2
            cfg = cfg._replace(block_k=block_k, num_warps=8 if M > 32 else cfg.num_warps)
        if not cfg.use_dot or seg % cfg.block_k:
            raise ValueError(f"a per-segment norm (segments of {seg} columns) needs the tl.dot form with K tiles "
                             f"inside one segment; config has use_dot={cfg.use_dot}, block_k={cfg.block_k}")
    if isinstance(norm.eps, bool) or not isinstance(norm.eps, (int, float)) or not norm.eps > 0:
        raise ValueError(f"norm.eps = {norm.eps!r} must be a positive number")
    return cfg


def _check_conv(conv: object, M: int, N: int, device: torch.device, validate: bool) -> ConvStep | TreeConv:
    if isinstance(conv, TreeConv):
        return _check_tree_conv(conv, M, N, device, validate)
    if not isinstance(conv, ConvStep):
        raise TypeError(f"conv must be a ConvStep, a TreeConv or None, got {type(conv).__name__}")
    _check_conv_weights(conv, N, device, (torch.float32,))
    slots = check_slots(conv.slots, M, conv.state_pool.shape[0], device, validate, distinct=True)
    return conv._replace(slots=slots, silu=bool(conv.silu))


def _check_conv_weights(conv: ConvStep | TreeConv, N: int, device: torch.device, pool_dtypes: tuple) -> int:
    """The conv's ``weight: [C, W]`` (C within the N output columns, W >= 2) and ``state_pool: [P, W - 1, C]``;
    returns C."""
    check_tensor("conv.weight", conv.weight, (None, None), "C, W", FLOAT_DTYPES, device, contiguous=True)
    C, width = conv.weight.shape
    if not 1 <= C <= N:
        raise ValueError(f"conv.weight has C = {C} channels; the conv takes the first 1 to N = {N} output columns")
    if width < 2:
        raise ValueError("conv.weight has W = 1 tap: a width-1 convolution keeps no state")
    check_tensor("conv.state_pool", conv.state_pool, (None, width - 1, C), "P, W - 1, C", pool_dtypes, device,
                 contiguous=True)
    return C


def _check_tree_conv(conv: TreeConv, M: int, N: int, device: torch.device, validate: bool) -> TreeConv:
    C = _check_conv_weights(conv, N, device, FLOAT_DTYPES)
    parents = check_tensor("conv.parents", conv.parents, (None, None), "B, nodes", (torch.int32,), device,
                           contiguous=True)
    B, nodes = parents.shape
    if B * nodes != M:
        raise ValueError(f"conv.parents is [{B}, {nodes}]: B * nodes = {B * nodes} must equal the {M} rows of x")
    check_tensor("conv.num_nodes", conv.num_nodes, (B,), "B", (torch.int32,), device, contiguous=True)
    slots = check_slots(conv.slots, B, conv.state_pool.shape[0], device, validate, distinct=False)
    check_tensor("conv.out", conv.out, (B, nodes, C), "B, nodes, C", FLOAT_DTYPES, device, contiguous=True)
    if validate:
        check_num_nodes(conv.num_nodes, B, nodes, device, True)
        check_tree_rows(parents, conv.num_nodes)
    return conv._replace(slots=slots, silu=bool(conv.silu))


def _weight(w: torch.Tensor | Fp8Weight) -> torch.Tensor:
    return w.weight if isinstance(w, Fp8Weight) else w


def _launch(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, cfg: GemvConfig, pdl: bool, swiglu: bool,
            norm: RowNorm | None, out_parts: torch.Tensor | None, scaling: tuple | None,
            conv: ConvStep | TreeConv | None) -> None:
    """One launch of :func:`_gemv_kernel` writing ``y`` (``out_parts`` given: ``y`` is a residual stream, updated;
    ``scaling = (scale, scaled)``: also ``scaled = round(y * scale)``)."""
    device = x.device
    M, N = x.shape[0], w.shape[0]
    K = w.shape[1]
    split_k, k_per_split = _split_k_range(K, cfg.block_k, cfg.split_k)
    if split_k > 1:
        partials, counters = split_k_scratch(device, M, N, cfg.block_n, split_k)  # [S, M, N], [row blocks]
    else:
        partials, counters = y, y  # unused
    m_pad = max(16, triton.next_power_of_2(M)) if cfg.use_dot else triton.next_power_of_2(M)
    pdl = bool(pdl) and pdl_supported(device)
    opts = {} if interpreting() else {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    if pdl:
        opts["launch_pdl"] = True
    n_norm_parts = norm.parts.shape[-1] if norm is not None else 1
    norm_segments = norm.parts.shape[1] if norm is not None and norm.parts.ndim == 3 else 1
    x_desc, w_desc = _descriptors(x, w, cfg, m_pad) if cfg.tma and tma_possible(x, w) else (None, None)
    tree = isinstance(conv, TreeConv)
    fp8 = isinstance(w, Fp8Weight)
    w_data = _weight(w)
    grid = (triton.cdiv(N, cfg.block_n), split_k)
    _gemv_kernel[grid](
        x, w_data, x if x_desc is None else x_desc, w_data if w_desc is None else w_desc, y, partials, counters,
        norm.parts if norm is not None else y, out_parts if out_parts is not None else y,
        *(scaling if scaling is not None else (y, y)),
        M, N, K, x.stride(0), y.stride(0), k_per_split, split_k, float(norm.eps) if norm is not None else 1.0,
        n_norm_parts, K // norm_segments, out_parts.shape[1] if out_parts is not None else 1,
        *((conv.slots, conv.weight, conv.state_pool, conv.weight.shape[0]) if conv is not None else (y, y, y, 0)),
        *((conv.num_nodes, conv.parents, conv.parents.stride(0), conv.out, conv.parents.shape[1]) if tree
          else (y, y, 0, y, 1)),
        M_PAD=m_pad, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, EVEN_K=K % cfg.block_k == 0,
        USE_DOT=cfg.use_dot, TMA=x_desc is not None, IEEE=x.dtype == torch.float32, PDL=pdl,
        EARLY_TRIGGER=M <= EARLY_TRIGGER_MAX_ROWS,
        SWIGLU=bool(swiglu),
        NORM=norm is not None, NORM_SEGMENTS=norm_segments,
        SPLIT_SEGMENTS=_split_segments(K, k_per_split, split_k, K // norm_segments),
        NORM_PARTS_PAD=triton.next_power_of_2(n_norm_parts), RESIDUAL=out_parts is not None, SCALED=scaling is not None,
        CONV=isinstance(conv, ConvStep), CONV_WIDTH=conv.weight.shape[1] if conv is not None else 2,
        CONV_RP=max(2, triton.next_power_of_2(conv.weight.shape[1] - 1)) if conv is not None else 2,
        CONV_WP=triton.next_power_of_2(conv.weight.shape[1]) if conv is not None else 2,
        CONV_SILU=conv is not None and conv.silu, TREE_CONV=tree,
        ws_ptr=w.scale if fp8 else y, wr_ptr=w.scale_rows if fp8 else y, n_kb=w.scale.shape[-1] if fp8 else 1, FP8=fp8,
        KSUB=min(cfg.block_k, FP8_BLOCK_K) if fp8 else cfg.block_k, **opts,
    )  # fmt: skip


def _split_segments(K: int, k_per_split: int, split_k: int, seg_len: int) -> int:
    """The most segments of ``seg_len`` columns one K split touches, as a power of two."""
    touched = max((min((s + 1) * k_per_split, K) - 1) // seg_len - s * k_per_split // seg_len + 1
                  for s in range(split_k))
    return triton.next_power_of_2(touched)


def _descriptors(x: torch.Tensor, w: torch.Tensor, cfg: GemvConfig, m_pad: int) -> tuple:
    """Host-built tensor descriptors of ``x`` (block ``[m_pad, block_k]``) and ``w`` (``[block_n, block_k]``),
    zero padding past the edges."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return (TensorDescriptor.from_tensor(x, [m_pad, cfg.block_k]),
            TensorDescriptor.from_tensor(w, [cfg.block_n, cfg.block_k]))
