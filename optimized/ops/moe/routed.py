"""Host side of the routed MoE block (:mod:`~lumotree.optimized.ops.moe`): the launch rule, argument checks, the
plan buffers and the public call :func:`moe_routed`."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import triton

from ..checks import FLOAT_DTYPES, check_finite, check_tensor, num_sms
from ..gemv import FP8_BLOCK_K, Fp8Weight
from .kernels import (_combine_kernel, _down_kernel, _gate_up_kernel, _route_kernel, _scan_kernel,
                      _scatter_kernel)

__all__ = ["MoEConfig", "moe_config", "moe_routed", "route_warps", "MAX_EXPERTS"]

MAX_EXPERTS = 4096  #: the router kernel holds a block's ``[tokens, next_pow2(E)]`` probabilities in registers
ROUTE_ELEMENTS = 8192  #: probabilities per router program: ``route_tokens = ROUTE_ELEMENTS / next_pow2(E)``
ROUTE_ELEMENTS_PER_WARP = 1024  #: router warps: ``[tokens, next_pow2(E)] / 1024``, 4 to 16 (8 at 16 x 512: no spills)
SCAN_ELEMENTS = 8192  #: counts per step of the one-program scan
COMBINE_BLOCK = 512  #: hidden columns per combine program


class MoEConfig(NamedTuple):
    """Launch of :func:`moe_routed`: ``block_m`` sorted (token, expert) rows per grouped-GEMM tile (one expert a
    tile), ``gate_up_n`` intermediate columns per gate | up program, ``down_n`` hidden columns per down program,
    ``block_k`` the reduction tile of both, ``route_tokens`` tokens per router program (every token in one program
    when ``T <= route_tokens``: no scan and scatter launches). Powers of two; ``block_*`` at least 16 (``tl.dot``)."""

    block_m: int
    gate_up_n: int
    down_n: int
    block_k: int
    route_tokens: int
    num_warps: int = 4
    num_stages: int = 3


def moe_config(T: int, top_k: int, E: int, I: int, Dm: int, device: torch.device | str, sms: int | None = None,
               fp8: bool = False) -> MoEConfig:
    """Default launch for ``T`` tokens, top ``top_k`` of ``E`` experts of width ``I``, hidden size ``Dm``: a rule,
    not a measured sweep (``bench/moe.py`` times it):

    - ``block_m`` from the mean rows per touched expert ``r = T k / min(E, T k)``: 16 up to 16 rows (decode: one
      row a tile), 32 up to 48, else 64;
    - ``gate_up_n`` / ``down_n``: the widest of 128, 64, 32, 16 that still gives at least four programs per SM
      over the expected tiles ``min(E, T k) cdiv(r, block_m)`` (decode streams the weights with many small
      programs; large steps reuse each weight tile over more rows);
    - ``block_k``: 64 where a weight tile is 128 wide or the tile has more than 16 rows, else 128 (at most 16 KB
      of bf16 weight per tile and stage); 8 warps on 64 x 128 tiles; every block shrunk to the problem;
    - ``route_tokens = 8192 / next_pow2(E)`` (16 tokens at 512 experts) up to 128.

    ``sms``: the device's SM count (None: read from ``device``). ``fp8``: block-FP8 experts (each K tile's product
    is scaled apart from the accumulator): 8 warps from 32 x 128 tiles up (4 spill there on sm_90).
    """
    pairs = T * top_k
    touched = max(1, min(E, pairs))
    rows = triton.cdiv(pairs, touched)
    block_m = 16 if rows <= 16 else 32 if rows <= 48 else 64
    tiles = touched * triton.cdiv(rows, block_m)
    target = 4 * (sms if sms is not None else num_sms(torch.device(device)))

    def widest(N: int) -> int:
        block_n = 128
        while block_n > 16 and tiles * triton.cdiv(N, block_n) < target:
            block_n //= 2
        return min(block_n, max(16, triton.next_power_of_2(N)))

    gate_up_n, down_n = widest(I), widest(Dm)
    block_k = 128 if block_m == 16 and max(gate_up_n, down_n) < 128 else 64
    block_k = min(block_k, max(16, triton.next_power_of_2(min(I, Dm))))
    route_tokens = max(1, min(128, ROUTE_ELEMENTS // triton.next_power_of_2(E)))
    warps = 8 if block_m == 64 and max(gate_up_n, down_n) == 128 else 4
    if fp8 and block_m * max(gate_up_n, down_n) >= 32 * 128:
        warps = 8
    return MoEConfig(block_m, gate_up_n, down_n, block_k, route_tokens, warps, 3)


def route_warps(block_t: int, e_pad: int) -> int:
    """Warps of a router program over ``[block_t, e_pad]`` probabilities."""
    return max(4, min(16, block_t * e_pad // ROUTE_ELEMENTS_PER_WARP))


def _is_pow2(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1 and v & (v - 1) == 0


def _check_config(config: object) -> MoEConfig:
    if not isinstance(config, MoEConfig):
        raise TypeError(f"config must be a MoEConfig or None, got {type(config).__name__}")
    for name in ("block_m", "gate_up_n", "down_n", "block_k"):
        value = getattr(config, name)
        if not _is_pow2(value) or value < 16:
            raise ValueError(f"config.{name} = {value!r} must be a power of two >= 16 (tl.dot tiles)")
    for name in ("route_tokens", "num_warps"):
        if not _is_pow2(getattr(config, name)):
            raise ValueError(f"config.{name} = {getattr(config, name)!r} must be a power of two")
    if isinstance(config.num_stages, bool) or not isinstance(config.num_stages, int) or config.num_stages < 1:
        raise ValueError(f"config.num_stages = {config.num_stages!r} must be a positive int")
    return config


def _check_weight(name: str, w: object, shape: tuple[int | None, ...], dims: str, dtype: torch.dtype,
                  device: torch.device) -> None:
    """A weight argument: a tensor of x's dtype, or an :class:`~lumotree.optimized.ops.gemv.Fp8Weight` of that
    shape (float8 values, float32 scales ``[..., R, cdiv(K, 128)]``, int32 scale-row indices, contiguous, no float
    tail; the indices' range is checked by :func:`_check_scale_rows`)."""
    if not isinstance(w, Fp8Weight):
        check_tensor(name, w, shape, dims, (dtype,), device)
        return
    if w.tail is not None:
        raise ValueError(f"{name} is an Fp8Weight with a float tail: give the experts one kind (dequantise it)")
    check_tensor(f"{name}.weight", w.weight, shape, dims, (torch.float8_e4m3fn,), device, contiguous=True)
    *lead, N, K = w.weight.shape
    check_tensor(f"{name}.scale", w.scale, (*lead, None, triton.cdiv(K, FP8_BLOCK_K)),
                 "E, R, cdiv(K, 128)" if lead else "R, cdiv(K, 128)",
                 (torch.float32,), device, contiguous=True)
    check_tensor(f"{name}.scale_rows", w.scale_rows, (N,), "N", (torch.int32,), device, contiguous=True)


def _check_scale_rows(name: str, w: object) -> None:
    """An :class:`Fp8Weight`'s scale-row indices lie in ``[0, R)`` (reads them to the host)."""
    if isinstance(w, Fp8Weight) and w.scale_rows.numel():
        lo, hi, R = int(w.scale_rows.min()), int(w.scale_rows.max()), w.scale.shape[-2]
        if lo < 0 or hi >= R:
            raise ValueError(f"{name}.scale_rows holds {lo if lo < 0 else hi}: the indices must lie in [0, R = {R})")


def _check_shared(shared_gate_up, shared_down, shared_gate, Dm: int, dtype: torch.dtype, device: torch.device
                  ) -> int:
    """The shared expert's weights (all three or none); returns its width ``Is`` (0: none)."""
    given = [t is not None for t in (shared_gate_up, shared_down, shared_gate)]
    if not any(given):
        return 0
    if not all(given):
        missing = [n for n, g in zip(("shared_gate_up", "shared_down", "shared_gate"), given) if not g]
        raise ValueError(f"{', '.join(missing)} is None: the shared expert needs shared_gate_up, shared_down and "
                         "shared_gate")
    _check_weight("shared_gate_up", shared_gate_up, (None, Dm), "2 Is, Dm", dtype, device)
    if shared_gate_up.shape[0] < 2 or shared_gate_up.shape[0] % 2:
        raise ValueError(f"shared_gate_up has {shared_gate_up.shape[0]} rows: gate rows then up rows, an even "
                         "number >= 2")
    Is = shared_gate_up.shape[0] // 2
    _check_weight("shared_down", shared_down, (Dm, Is), "Dm, Is", dtype, device)
    check_tensor("shared_gate", shared_gate, (1, Dm), "1, Dm", (dtype,), device)
    return Is


def _check_inputs(x, router, w_gate_up, w_down, top_k, norm_topk_prob, first_expert: int | None = None
                  ) -> tuple[int, int, int, int]:
    """``(T, Dm, E, I)`` of valid inputs; raises naming the first bad argument."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    check_tensor("x", x, (None, None), "T, Dm", FLOAT_DTYPES, x.device)
    T, Dm = x.shape
    if T == 0 or Dm == 0:
        raise ValueError(f"x has shape {tuple(x.shape)}: T = {T} tokens and Dm = {Dm} must be positive")
    check_tensor("router", router, (None, Dm), "E, Dm", (x.dtype,), x.device)
    E = router.shape[0]
    if not 1 <= E <= MAX_EXPERTS:
        raise ValueError(f"router has {E} rows: the number of experts E must lie in [1, {MAX_EXPERTS}]")
    local, held = E, "E"  # experts held (expert parallel: a block of El)
    if first_expert is not None:
        local, held = (w_gate_up.shape[0] if len(w_gate_up.shape) == 3 else E), "El"
        if isinstance(first_expert, bool) or not isinstance(first_expert, int) or not (
                0 <= first_expert and 1 <= local and first_expert + local <= E):
            raise ValueError(f"first_expert = {first_expert!r}: the {local} experts held must lie in [0, E = {E})")
    _check_weight("w_gate_up", w_gate_up, (local, None, Dm), f"{held}, 2I, Dm", x.dtype, x.device)
    if w_gate_up.shape[1] < 2 or w_gate_up.shape[1] % 2:
        raise ValueError(f"w_gate_up has {w_gate_up.shape[1]} rows per expert: gate rows then up rows, an even "
                         "number >= 2")
    I = w_gate_up.shape[1] // 2
    _check_weight("w_down", w_down, (local, Dm, I), f"{held}, Dm, I", x.dtype, x.device)
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise TypeError(f"top_k must be an int, got {type(top_k).__name__}")
    if not 1 <= top_k <= E:
        raise ValueError(f"top_k = {top_k} must lie in [1, E = {E}]")
    if not isinstance(norm_topk_prob, bool):
        raise TypeError(f"norm_topk_prob must be a bool, got {type(norm_topk_prob).__name__}")
    return T, Dm, E, I


def moe_routed(x: torch.Tensor, router: torch.Tensor, w_gate_up: torch.Tensor | Fp8Weight,
               w_down: torch.Tensor | Fp8Weight, *, top_k: int, norm_topk_prob: bool,
               shared_gate_up: torch.Tensor | Fp8Weight | None = None,
               shared_down: torch.Tensor | Fp8Weight | None = None, shared_gate: torch.Tensor | None = None,
               config: MoEConfig | None = None, validate: bool = True, out: torch.Tensor | None = None,
               first_expert: int | None = None) -> torch.Tensor:
    """The Qwen3-Next / Qwen3.5-MoE sparse MoE block on ``x: [T, Dm]``, reading only the routed experts' weights:

    ``p = softmax(x router^T)`` (logits rounded to x's dtype, softmax in fp32); the ``top_k`` largest (ties: the
    lower expert index) with weights ``w_j = p_j`` or, ``norm_topk_prob``, ``p_j / sum_j p_j``, rounded to x's
    dtype; ``out = sum_j w_j down_e(silu(gate_e x) * up_e x) + sigmoid(shared_gate x) shared(x)``.

    ``router: [E, Dm]``, ``w_gate_up: [E, 2I, Dm]`` (each expert's gate rows, then its up rows), ``w_down:
    [E, Dm, I]``; the shared expert (all three or none) ``shared_gate_up: [2Is, Dm]``, ``shared_down: [Dm, Is]``,
    ``shared_gate: [1, Dm]``. One float dtype, one device, contiguous last dims; fp32 accumulation, each expert's
    intermediate and output rounded to x's dtype, the sum over experts in fp32 in the order of ``j``. Returns
    ``[T, Dm]`` in x's dtype (in ``out`` if given: contiguous, not x's memory). ``config`` overrides
    :func:`moe_config`. ``validate``: reject NaN / inf in ``x`` and out-of-range FP8 scale-row indices (host
    copies; off in CUDA-graph capture).

    Block FP8: ``w_gate_up``, ``w_down``, ``shared_gate_up`` and ``shared_down`` may each be an
    :class:`~lumotree.optimized.ops.gemv.Fp8Weight` (experts stacked: ``weight: [E, N, K]`` float8_e4m3fn,
    ``scale: [E, R, cdiv(K, 128)]``, one ``scale_rows: [N]``; no float tail). The grouped GEMMs dequantise each
    weight tile in registers (the e4m3 values converted to x's dtype, exact) and scale each K tile's fp32 product
    by its rows' block scales, so the block computes the dequantised weights' MoE with fp32 accumulation; only the
    routed experts' fp8 bytes are read. ``config.block_k`` must then divide 128.

    Expert parallel (``first_expert`` given): ``w_gate_up: [El, 2I, Dm]`` and ``w_down: [El, Dm, I]`` hold experts
    ``[first_expert, first_expert + El)`` of the router's ``E`` only: every token is routed over all ``E``, and
    ``out`` sums the pairs of these experts (plus the shared expert given); the other ranks' pairs count zero, so the
    sum over ranks of their outputs is the whole block."""
    T, Dm, E, I = _check_inputs(x, router, w_gate_up, w_down, top_k, norm_topk_prob, first_expert)
    device, dtype = x.device, x.dtype
    Is = _check_shared(shared_gate_up, shared_down, shared_gate, Dm, dtype, device)
    weights = dict(w_gate_up=w_gate_up, w_down=w_down, shared_gate_up=shared_gate_up, shared_down=shared_down)
    fp8 = [name for name, w in weights.items() if isinstance(w, Fp8Weight)]
    cfg = moe_config(T, top_k, E, I, Dm, device, fp8=bool(fp8)) if config is None else _check_config(config)
    if fp8 and FP8_BLOCK_K % cfg.block_k:
        raise ValueError(f"config.block_k = {cfg.block_k} must divide {FP8_BLOCK_K} with block-FP8 weights "
                         f"({fp8[0]}): a K tile lies in one scale block")
    if out is None:
        out = torch.empty((T, Dm), dtype=dtype, device=device)  # [T, Dm]
    else:
        check_tensor("out", out, (T, Dm), "T, Dm", (dtype,), device, contiguous=True)
        if out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
            raise ValueError("out shares memory with x: the combine reads x's rows while it stores")
    if validate:
        check_finite("x", x)
        for name in fp8:
            _check_scale_rows(name, weights[name])
    _launch(x, router, w_gate_up, w_down, top_k, norm_topk_prob, shared_gate_up, shared_down, shared_gate, Is,
            cfg, out, first_expert)
    return out


def _shared_args(w: torch.Tensor | Fp8Weight) -> tuple:
    """A weight's kernel arguments ``(values, row stride, scales, scale row stride, scale rows)``; a float weight's
    scale arguments: the values again and stride 0 (not read)."""
    if isinstance(w, Fp8Weight):
        return (w.weight, w.weight.stride(-2), w.scale, w.scale.stride(-2), w.scale_rows)
    return (w, w.stride(-2), w, 0, w)


def _expert_args(w: torch.Tensor | Fp8Weight) -> tuple:
    """Stacked experts' kernel arguments ``(values, expert stride, row stride, scales, scale expert stride, scale
    row stride, scale rows)``."""
    values, s_r, scales, s_sr, rows = _shared_args(w)
    return (values, values.stride(0), s_r, scales, scales.stride(0) if isinstance(w, Fp8Weight) else 0, s_sr, rows)


class _HostStep:
    """Torch ops between two launches, in the launch list's form: ``step[grid]()`` runs ``fn()``."""

    def __init__(self, fn: Any):
        self.fn = fn

    def __getitem__(self, grid: tuple) -> Any:
        return self.fn


class Launch(NamedTuple):
    """One kernel launch of the block: ``kernel[grid](*args, **meta)``."""

    kernel: Any
    grid: tuple[int, ...]
    args: tuple
    meta: dict


def _launch(*inputs) -> None:
    """Run :func:`_launches`' kernels in order."""
    for kernel, grid, args, meta in _launches(*inputs):
        kernel[grid](*args, **meta)


def _launches(x, router, w_gate_up, w_down, top_k, norm, shared_gate_up, shared_down, shared_gate, Is: int,
              cfg: MoEConfig, out: torch.Tensor, first_expert: int | None = None) -> list[Launch]:
    """The router logits (cuBLAS, computed here), the buffers, and the launches of the routing kernels, the two
    grouped GEMMs and the combine (kernels' docstring), in order. Meta tensors give the launches without a GPU
    (:mod:`~lumotree.optimized.ops.moe.resources` compiles them)."""
    T, Dm = x.shape
    E, I = router.shape[0], w_down.shape[2]
    P, device, dtype = T * top_k, x.device, x.dtype
    i32 = dict(dtype=torch.int32, device=device)
    logits = torch.matmul(x, router.T)  # [T, E] in x's dtype, as transformers' F.linear
    ids = torch.empty((T, top_k), **i32)  # [T, k]
    weights = torch.empty((T, top_k), dtype=torch.float32, device=device)  # [T, k]
    totals = torch.empty((E,), **i32)  # [E] pairs per expert
    sorted_pair = torch.empty((P,), **i32)  # [P] pair index t k + j, grouped by expert
    e_pad, k_pad = triton.next_power_of_2(E), triton.next_power_of_2(top_k)
    block_t = min(cfg.route_tokens, triton.next_power_of_2(T))
    blocks = triton.cdiv(T, block_t)
    single = blocks == 1
    counts = torch.empty((blocks, E), **i32) if not single else totals  # [NB, E]
    rank = torch.empty((T, top_k), **i32) if not single else ids  # [T, k]
    launches = [Launch(_route_kernel, (blocks,), (logits, ids, weights, counts, rank, totals, sorted_pair, T, E),
                       dict(TOP_K=top_k, NORM=norm, SINGLE=single, BLOCK_T=block_t, E_PAD=e_pad, K_PAD=k_pad,
                            num_warps=route_warps(block_t, e_pad)))]
    if not single:
        base = torch.empty((blocks, E), **i32)  # [NB, E] first sorted position of (block, expert)
        block_nb = max(1, min(triton.next_power_of_2(blocks), SCAN_ELEMENTS // e_pad))
        launches += [Launch(_scan_kernel, (1,), (counts, base, totals, blocks, E), dict(BLOCK_NB=block_nb,
                                                                                        E_PAD=e_pad)),
                     Launch(_scatter_kernel, (blocks,), (ids, rank, base, sorted_pair, T, E),
                            dict(TOP_K=top_k, BLOCK_T=block_t))]

    held = w_down.shape[0]  # experts of this rank (all E on one process)
    if held != E:  # expert parallel: the pairs re-sorted by held expert (others last, in no tile), as totals [El]
        local_sorted, local_totals = torch.empty((P,), **i32), torch.empty((held,), **i32)

        def resort() -> None:  # fixed shapes: CUDA-graph safe
            key = ids.view(-1).long() - first_expert  # [P]
            key = torch.where((key >= 0) & (key < held), key, held)
            local_sorted.copy_(torch.sort(key, stable=True).indices)
            local_totals.copy_(torch.zeros(held + 1, dtype=torch.int64, device=device).scatter_add_(
                0, key, torch.ones_like(key))[:held])

        launches.append(Launch(_HostStep(resort), (), (), {}))
        E, totals, sorted_pair, e_pad = held, local_totals, local_sorted, triton.next_power_of_2(held)
    has_shared = Is > 0
    bm = cfg.block_m
    # no shared expert: the experts' weights stand in (of their kind, so that the unused branch compiles)
    ws_up, ws_dn = (shared_gate_up, shared_down) if has_shared else (w_gate_up, w_down)
    shared_tiles = triton.cdiv(T, bm) if has_shared else 0
    routed_tiles = (P + min(E, P) * (bm - 1)) // bm  # >= sum_e cdiv(count_e, bm) over the experts holding pairs
    grid_m = shared_tiles + routed_tiles
    act = torch.empty((P, I), dtype=dtype, device=device)  # [P, I] silu(g) u in sorted order
    act_s = torch.empty((T, Is), dtype=dtype, device=device) if has_shared else act  # [T, Is]
    gemm = dict(BLOCK_M=bm, E_PAD=e_pad, IEEE=dtype == torch.float32, num_warps=cfg.num_warps,
                num_stages=cfg.num_stages)
    kinds = lambda w, ws: dict(FP8=isinstance(w, Fp8Weight), FP8_S=isinstance(ws, Fp8Weight))  # noqa: E731
    gate_up_n = min(cfg.gate_up_n, max(16, triton.next_power_of_2(max(I, Is))))
    block_k = min(cfg.block_k, max(16, triton.next_power_of_2(Dm)))
    launches.append(Launch(_gate_up_kernel, (grid_m, triton.cdiv(max(I, Is), gate_up_n)), (
        x, x.stride(0), *_expert_args(w_gate_up), *_shared_args(ws_up), act, act_s, totals, sorted_pair, T, E, I,
        Is, Dm, shared_tiles),
        dict(gemm, TOP_K=top_k, BLOCK_N=gate_up_n, BLOCK_K=block_k, EVEN_K=Dm % block_k == 0,
             **kinds(w_gate_up, ws_up))))

    y = (torch.empty if held == router.shape[0] else torch.zeros)(
        (P, Dm), dtype=dtype, device=device)  # [P, Dm] each pair's weighted expert output (others' pairs: 0)
    y_s = torch.empty((T, Dm), dtype=dtype, device=device) if has_shared else y  # [T, Dm]
    down_n = min(cfg.down_n, max(16, triton.next_power_of_2(Dm)))
    down_k = min(cfg.block_k, max(16, triton.next_power_of_2(max(I, Is))))
    launches.append(Launch(_down_kernel, (grid_m, triton.cdiv(Dm, down_n)), (
        act, act_s, *_expert_args(w_down), *_shared_args(ws_dn), y, y_s, totals, sorted_pair, weights, T, E, I,
        Is, Dm, shared_tiles),
        dict(gemm, BLOCK_N=down_n, BLOCK_K=down_k, EVEN_K=I % down_k == 0 and Is % down_k == 0,
             **kinds(w_down, ws_dn))))

    block_d = min(COMBINE_BLOCK, triton.next_power_of_2(Dm))
    launches.append(Launch(_combine_kernel, (T, triton.cdiv(Dm, block_d)), (
        y, y_s, x, x.stride(0), shared_gate if has_shared else x, out, Dm), dict(TOP_K=top_k, HAS_SHARED=has_shared,
                                                                                   BLOCK_D=block_d)))
    return launches
