r"""Launch parameters of the portable GDN tree verify and of the commit, and the rules that pick them per shape.

Each default is the faster side of a same-run A / B on an H200 at Qwen3-Next shapes (H = 16, HV = 32, K = V = 128);
the docs' GDN kernel page lists the measured tables.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton

from ..checks import num_sms

__all__ = ["KernelConfig", "verify_config", "commit_config", "RANK_ONE_BLOCK"]

RANK_ONE_BLOCK = 4  # commit with KernelConfig.rank_one: path nodes whose loads are in flight together




class KernelConfig(NamedTuple):
    """Launch parameters of verify and commit (:func:`verify_config`, :func:`commit_config` pick them per shape;
    each default the faster side of a same-run A / B on an H200 at Qwen3-Next shapes).

    Attributes:
        block_v: V columns per program (verify's apply or fused kernel, commit).
        block_k: K rows per chunk; in the commit, state rows per program (K / block_k programs share a (request,
            value head, V block)).
        num_warps: warps of the apply, the fused kernel or the commit.
        num_stages: software-pipelining stages of their K loops.
        split: verify as two kernels (a per-(request, value head) solve of the ``[N, N]`` system, then a
            per-V-block apply over ``S0``) instead of one fused kernel.
        solve_warps: warps of the split solve.
        word_vectors: read the ancestor bitsets as W ``[N]`` vectors instead of an ``[N, N]`` gather.
        solve_heads: value heads of one GVA group per solve program (``K K^T``, ``Q K^T`` formed once for them;
            a divisor of ``HV // H``).
        solve_stages: stages of the solve's K loop (0: ``num_stages``).
        dot16: with 16-bit q / k in a tensor-core mode, ``K K^T`` and ``Q K^T`` as 16-bit products of the loaded
            tiles (exact products, fp32 sums: :func:`_gram_products`).
        pdl: the fused kernel may be a programmatic dependent launch that prefetches ``S0`` before its wait
            (when the caller passes ``gdn_tree_verify(pdl=True)``).
        apply_pdl: the split apply is a programmatic dependent launch behind the solve, which signals at its
            start; the apply's pass over ``S0`` runs under the solve's tail and waits before reading its outputs.
        scratch16: the solve hands ``TB`` and ``QKD`` to the apply in fp16 scaled by a power of two
            (:func:`_store_scratch`; ``tf32`` mode with q / k normalised in the kernel): the values the apply's
            tf32 products would read from fp32 tiles, in half the memory.
        max_registers: a register cap (ptxas ``maxnreg``; 0: the compiler's choice) for the kernel that streams
            the state: the split apply in a verify config, the commit in a commit config.
        early_signal: with ``gdn_tree_verify(launch_dependents=True)`` the last verify kernel lets its PDL
            successor launch at its start; ``False``: only as its programs exit.
        rank_one: the commit adds the path's terms as fp32 outer products on the CUDA cores, ``RANK_ONE_BLOCK``
            nodes' loads at a time, instead of a ``tl.dot`` of ``PATH_BLOCK`` gathered nodes.
        tma: the split apply's, the fused kernel's or the commit's tiles through tensor descriptors (Hopper's
            TMA) where the tensors allow it (:func:`_tma_descriptors`).
        solve_tma: the split solve's q / k tiles through tensor descriptors.
        halves: ``(I + A)^{-1}`` from its diagonal halves (:func:`_inverse_unit_lower_halves`, from N = 32)
            instead of doubling the whole ``[N, N]`` tile.
        row_halves: the split solve as two programs per (request, value head), one per half of the rows
            (:func:`_gdn_tree_solve_rows_kernel`, from N = 32; ``solve_heads`` 1), instead of one over all rows.
        solve_max_registers: a register cap for the split solve (0: the compiler's choice).
    """

    block_v: int
    block_k: int
    num_warps: int
    num_stages: int = 2
    split: bool = True
    solve_warps: int = 8
    word_vectors: bool = False
    solve_heads: int = 1
    solve_stages: int = 0
    dot16: bool = True
    pdl: bool = False
    apply_pdl: bool = False
    scratch16: bool = False
    max_registers: int = 0
    early_signal: bool = True
    rank_one: bool = False
    tma: bool = False
    solve_tma: bool = False
    halves: bool = False
    row_halves: bool = False
    solve_max_registers: int = 0



def padded_nodes(N: int) -> int:
    """The tile of tree nodes for trees of up to ``N`` nodes: a power of two, 16 at least."""
    return max(16, triton.next_power_of_2(N))


def tile_constants(NP: int) -> dict:
    """The node tile's constants of the kernels that run the doubling: ``NP`` padded nodes and ``LOG_NP = log2 NP``,
    the most doubling factors :func:`_levels_of` counts (a tree of at most ``NP`` nodes is at most ``NP - 1`` deep,
    and ``bit_length(NP - 1) = log2 NP``)."""
    return dict(NP=NP, LOG_NP=NP.bit_length() - 1)


def solve_constants(cfg: KernelConfig, NP: int) -> dict:
    """The split solve's ``GATES_FIRST`` (one head, up to N = 64) and ``HALVES`` for config ``cfg`` at ``NP``
    padded nodes."""
    return dict(GATES_FIRST=cfg.solve_heads == 1 and NP <= 64, HALVES=use_halves(cfg, NP))


def fused_constants(cfg: KernelConfig, NP: int) -> dict:
    """The fused kernel's ``GATES_FIRST`` (up to N = 64) and ``HALVES``."""
    return dict(GATES_FIRST=NP <= 64, HALVES=use_halves(cfg, NP))


def use_halves(cfg: KernelConfig, NP: int) -> bool:
    """``HALVES``: ``cfg.halves`` from N = 32 (halves of at least 16 rows, the tensor cores' smallest tile)."""
    return bool(cfg.halves) and NP >= 32


def use_row_halves(cfg: KernelConfig, NP: int) -> bool:
    """The split solve by row halves (:func:`_gdn_tree_solve_rows_kernel`): ``cfg.row_halves`` from N = 32, as
    :func:`use_halves`."""
    return bool(cfg.row_halves) and NP >= 32


def verify_config(B: int, HV: int, N: int, K: int, V: int, device: torch.device, H: int | None = None,
                  precision: str = "tf32", dtype: torch.dtype = torch.float32, sms: int | None = None) -> KernelConfig:
    """Default launch parameters of verify at Qwen3-Next-like shapes on an H200 (each rule the winner of a same-run
    A / B on that card).

    - ``ieee`` past N = 64, every batch: the split pipeline, 16-column apply at 8 warps, an 8-warp 2-stage solve
      by row halves (``row_halves``).
    - Large batches (``B * HV >= 2x`` the SMs): the split pipeline. The solve takes the two value heads of a GVA
      group (``H`` given, ``HV // H`` even) in one 4-warp program up to N = 64, 3 stages (past N = 64 by row halves
      at 4 warps, 2 stages; ``ieee`` below); the apply 64 columns up to N = 32, 32 at
      N = 64, 128 at 8 warps past it. In ``tf32`` at N = 64 the scratch is fp16 and the apply has 3 stages capped
      at 128 registers; from ``B * HV >= 8x`` the SMs it takes 64 columns uncapped and signals its PDL successor
      only as it exits (``early_signal=False``).
    - Small batches at N = 64 in the tensor-core modes: the split pipeline, one value head per 4-warp solve, a
      3-stage 32-column apply, fp16 scratch; past N = 64 an 8-warp 2-stage solve by row halves and a 64-column
      8-warp apply.
    - Small batches otherwise (N <= 32, ``ieee`` at N = 64): the fused kernel, 32 columns, 4 warps, 3 stages; when
      its programs fit in one wave at N = 32, 16-row K chunks and 4 stages.
    - Every split pipeline: the apply a PDL launch behind the solve; the solve's q / k through tensor descriptors
      (not in the solve by row halves); the apply's tiles too from N = 64 (not ``ieee`` at N = 128); the
      solve by halves past N = 64. The fused kernel's tiles through descriptors in the tensor-core modes with fp32
      inputs (``dtype``: q / k / v's), except at the one-wave N = 32 shape.
    """
    NP = padded_nodes(N)
    sm_count = sms or num_sms(device)
    if NP > 64 and precision == "ieee":  # every batch: the apply at 16 columns (79 registers, no stack; 128 columns
        # compile to 32 registers and 16 KB of stack), the split pipeline at small batches too (verify + commit at
        # N = 128: B = 64 23252.6 -> 19596.2 us; B = 1 against the one-kernel form 4286.4 -> 620.9), the solve by
        # row halves at 8 warps (B = 64 4978.8 -> 4831.4, B = 1 181.8 -> 152.4 against one 16-warp program per
        # value head)
        return KernelConfig(min(16, V), min(K, 32), 8, 2, True, 8, apply_pdl=True, halves=True, row_halves=True)
    if B * HV >= 2 * sm_count:
        block_v, num_warps = (64, 4) if NP <= 32 else (32, 4) if NP <= 64 else (128, 8)
        pair = 2 if NP <= 64 and H is not None and (HV // H) % 2 == 0 else 1
        # tf32 at N = 64: fp16 scratch (where the norms are in the kernel), the apply at 3 stages capped at 128
        # registers (4 programs per SM; compile-only, no spills with fp32 scratch either); tf32x3's apply would
        # spill at the cap (150 registers uncapped)
        fp16_scratch = NP == 64 and precision == "tf32"
        # from ~8 programs' worth of (request, value head) pairs per SM: 64-column apply blocks (q / k read half as
        # often; 166 registers, 3 programs per SM) and the commit launched only as the apply exits
        wide = fp16_scratch and B * HV >= 8 * sm_count
        # past N = 64 (the tensor-core modes; ieee above): the solve by row halves, 4 warps, 2 stages (against one
        # 8-warp program per value head: tf32 B = 64 1021.0 -> 980.5 us; tf32x3 B = 64 / 16 2467.3 / 635.0 ->
        # 1699.2 / 465.6)
        rows = NP > 64
        return KernelConfig(min(64 if wide else block_v, V), min(K, 32), num_warps, 3 if fp16_scratch else 2, True,
                            4, solve_heads=pair, solve_stages=2 if rows else 3, apply_pdl=True, scratch16=fp16_scratch,
                            max_registers=128 if fp16_scratch and not wide else 0,
                            early_signal=not wide, tma=NP >= 64, solve_tma=not rows, halves=NP > 64, row_halves=rows)
    if NP == 64 and precision != "ieee":  # small batches: one value head per solve program, fp16 scratch
        return KernelConfig(min(32, V), min(K, 32), 4, 3, True, 4, solve_heads=1, solve_stages=3, apply_pdl=True,
                            scratch16=True, solve_tma=True)
    if NP > 64:  # small batches in the tensor-core modes: the split pipeline, an 8-warp solve by row halves, a
        # 64-column apply through descriptors (against the one-kernel form: tf32 B = 1 65.8 -> 43.7 us, B = 8
        # 259.4 -> 179.8; tf32x3 B = 1 152.0 -> 85.1)
        return KernelConfig(min(64, V), min(K, 32), 8, 2, True, 8, solve_stages=2, apply_pdl=True, tma=True,
                            halves=True, row_halves=True)
    block_v, block_k, num_warps, stages = 32, 32, 4, 3
    one_wave = NP == 32 and B * HV * triton.cdiv(V, block_v) <= sm_count  # B = 1 at Qwen3-Next shapes
    if one_wave:  # cold states and the model's strided views: 10.8 against 12.2 us (fp32, state in L2: 15.2
        # against 17.3)
        block_k, stages = 16, 4
    return KernelConfig(min(block_v, V), min(K, block_k), num_warps, stages, False,
                        tma=precision != "ieee" and not one_wave and dtype == torch.float32)


def commit_config(B: int, HV: int, N: int, K: int, V: int, device: torch.device, precision: str = "tf32",
                  sms: int | None = None) -> KernelConfig:
    """Default launch parameters of the commit kernel (memory-bound: a ``[K, BV]`` state tile per program). Large
    batches (``B`` counts (layer, request) pairs when several layers commit in one launch): 64 columns, 4 warps,
    capped at 128 registers in ``tf32`` (4 programs per SM instead of 3), the path's terms as rank-one fp32 updates
    in ``ieee``; small batches ``[32, 32]`` tiles at 2 warps."""
    sm_count = sms or num_sms(device)
    if B * HV * 2 >= 2 * sm_count:
        return KernelConfig(min(V, 64), K, 4, 1, max_registers=128 if precision == "tf32" else 0,
                            rank_one=precision == "ieee")
    return KernelConfig(min(V, 32), min(K, 32), 2, 1)


def check_config(cfg: object) -> None:
    if not isinstance(cfg, KernelConfig):
        raise TypeError(f"config must be a KernelConfig, got {type(cfg).__name__}")
    for name in ("max_registers", "solve_max_registers"):
        cap = getattr(cfg, name)
        if cap and not 16 <= cap <= 255:
            raise ValueError(f"config.{name} = {cap}: 0 (the compiler's choice) or 16 to 255")
