"""Compile-only resource report of the GDN tree kernels for Hopper (sm_90): no GPU needed.

A kernel that compiles to a pathological register allocation still computes the right values, so value tests cannot
see it (an overlapped doubling in ``ieee`` mode once compiled to 32 registers and 8 KB of stack and ran 4x slower).
:func:`default_kernel_resources` compiles the kernels of the default verify configs (B = 1 and B = 64) and of the
B = 64 commit at Qwen3-Next shapes (H = 16, HV = 32, K = V = 128, fp32 inputs, q / k normalised in the kernel) for
``GPUTarget("cuda", 90, 128)``, every pointer and integer argument 16-aligned as the JIT specialises them, and reads
registers, stack and shared memory from ``cuobjdump -res-usage`` and the products' layouts from the TTGIR.

Run ``python -m lumotree.optimized.ops.gdn_tree.resources --nodes 64 --precision tf32`` (one JSON line a kernel),
without ``TRITON_INTERPRET``.
"""

from __future__ import annotations

import argparse
import json
import re

import torch
import triton

from ..cubin import cubin_resources, tools_present
from ..tree_meta import PATH_BLOCK, WORD_BITS
from .apply import _gdn_tree_apply_kernel, _gdn_tree_verify_kernel
from .commit import _gdn_tree_commit_kernel
from .common import GATE_PIECE, PRECISIONS
from .config import RANK_ONE_BLOCK, commit_config, fused_constants, padded_nodes, solve_constants, tile_constants, \
    use_row_halves, verify_config
from .solve import _gdn_tree_solve_kernel, _gdn_tree_solve_rows_kernel

__all__ = ["default_kernel_resources", "tools_present"]

H, HV, K, V = 16, 32, 128, 128
H200_SMS = 132  # the default configs as chosen on an H200
INT_POINTERS = ("slots_ptr", "words_ptr", "depth_ptr", "num_nodes_ptr", "accepted_ptr", "ready_ptr")


def _compile(kernel, constexprs: dict, num_warps: int, num_stages: int, maxnreg: int, descs: dict):
    """Triton's compile for sm_90 of ``kernel`` with every pointer fp32 (int32 for the index arrays, fp16 for the
    split pipeline's scratch with ``SCRATCH16``), aligned, under the register cap ``maxnreg`` (0: none)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    constexprs = dict(constexprs, **{n: None for n in kernel.arg_names if n.endswith("_desc") and n not in descs})
    signature = {}
    for name in kernel.arg_names:
        if name in descs:
            signature[name] = descs[name]
        elif name in constexprs:
            signature[name] = "constexpr"
        elif name in ("tb_ptr", "qkd_ptr") and constexprs.get("SCRATCH16"):
            signature[name] = "*fp16"
        elif name.endswith("_ptr"):
            signature[name] = "*i32" if name in INT_POINTERS else "*fp32"
        else:
            signature[name] = "fp32" if name == "scale" else "i32"
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kernel.arg_names)
             if signature[name] not in ("constexpr", "fp32") and name not in descs}
    src = ASTSource(fn=kernel, signature=signature, attrs=attrs,
                    constexprs={(kernel.arg_names.index(n),): v for n, v in constexprs.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 128),
                          options=dict(num_warps=num_warps, num_stages=num_stages,
                                       **({"maxnreg": maxnreg} if maxnreg else {})))


def overcovered_products(ttgir: str) -> int:
    """Products whose MMA layout spans more rows than their result has (``warpsPerCTA[0]`` warps of 16 rows each
    against M): at 8 warps on a 64-row tile the second warpgroup's operand reads pass the tile."""
    warps_m = {name: int(m) for name, m in
               re.findall(r"^(#mma\d*) = #ttg\.nvidia_mma<\{.*?warpsPerCTA = \[(\d+), \d+\]", ttgir, re.M)}
    rows = re.findall(r"(?:ttng\.warp_group_dot|tt\.dot) .*-> tensor<(\d+)x\d+x\w+, (#mma\d*)>", ttgir)
    return sum(int(m) < 16 * warps_m[layout] for m, layout in rows)


def _resources(compiled) -> dict:
    return dict(cubin_resources(compiled), overcovered=overcovered_products(compiled.asm["ttgir"]))


def _descriptor_types(names: tuple, NP: int, bk: int, bv: int, scratch: str) -> dict:
    blocks = dict(pool=f"fp32[{bk}, {bv}]", q=f"fp32[1, {NP}, 1, {bk}]", k=f"fp32[1, {NP}, 1, {bk}]",
                  v=f"fp32[1, {NP}, 1, {bv}]", tb=f"{scratch}[{NP}, {NP}]", qkd=f"{scratch}[{NP}, {NP}]",
                  o=f"fp32[1, {NP}, 1, {bv}]", delta=f"fp32[1, {NP}, 1, {bv}]")
    return {f"{n}_desc": f"tensordesc<{blocks[n]}>" for n in names}


def _default_kernels(N: int, precision: str) -> list[tuple]:
    """(label, kernel, constexprs, warps, stages, register cap, descriptor types) of the default configs."""
    NP = padded_nodes(N)
    flags = dict(H=H, HV=HV, K=K, NP=NP, GATED=False, BETA_TWO=False, L2NORM=True, PRECISION=precision, QK16=False)
    words = dict(W=(N + WORD_BITS - 1) // WORD_BITS, LOG_NP=tile_constants(NP)["LOG_NP"], WORD_BITS=WORD_BITS)
    device = torch.device("cuda", 0)
    out, seen = [], set()
    for B in (1, 64):
        cfg = verify_config(B, HV, N, K, V, device, H, precision, sms=H200_SMS)
        bv, bk = min(cfg.block_v, V), min(cfg.block_k, K)
        flags["WORD_VECTORS"] = cfg.word_vectors
        if cfg.split:
            scratch16 = bool(cfg.scratch16) and precision == "tf32"
            solve = dict(flags, **words, BK=bk, HEADS=cfg.solve_heads, DOT16=False, PDL=cfg.apply_pdl, HAS_NUM=True,
                         SCRATCH16=scratch16, TMA=cfg.solve_tma, **solve_constants(cfg, NP))
            apply = dict(H=H, HV=HV, K=K, NP=NP, L2NORM=True, PRECISION=precision, QK16=False, V=V, BK=bk, BV=bv,
                         GATE=False, PIECE=GATE_PIECE, PDL=cfg.apply_pdl, SIGNAL=False, HAS_NUM=True,
                         SCRATCH16=scratch16, TMA=cfg.tma)
            scratch = "fp16" if scratch16 else "fp32"
            solve_part = ("solve", _gdn_tree_solve_kernel, solve, cfg.solve_warps, 0,
                          _descriptor_types(("q", "k"), NP, bk, bv, scratch) if cfg.solve_tma else {})
            if use_row_halves(cfg, NP):
                rows = {n: v for n, v in solve.items() if n in _gdn_tree_solve_rows_kernel.arg_names}
                solve_part = ("solve rows", _gdn_tree_solve_rows_kernel, rows, cfg.solve_warps, 0, {})
            parts = [solve_part, ("apply", _gdn_tree_apply_kernel, apply, cfg.num_warps, cfg.max_registers,
                                  _descriptor_types(("pool", "q", "k", "v", "tb", "qkd", "o", "delta"), NP, bk, bv,
                                                    scratch) if cfg.tma else {})]
        else:
            one = dict(flags, **words, V=V, BK=bk, BV=bv, DOT16=False, PDL=False, STATE_LINES=1, GATE=False,
                       PIECE=GATE_PIECE, SIGNAL=False, HAS_NUM=True, TMA=cfg.tma, **fused_constants(cfg, NP))
            parts = [("one kernel", _gdn_tree_verify_kernel, one, cfg.num_warps, 0,
                      _descriptor_types(("pool", "q", "k", "v", "o", "delta"), NP, bk, bv, "fp32") if cfg.tma else {})]
        for part, kernel, constexprs, nw, cap, descs in parts:
            key = (part, tuple(sorted(constexprs.items())), nw, cfg.num_stages, cap)
            if key not in seen:
                seen.add(key)
                out.append((f"verify B={B} [{part}]", kernel, constexprs, nw, cfg.num_stages, cap, descs))
    cfg = commit_config(64, HV, N, K, V, device, precision, sms=H200_SMS)
    commit = dict(H=H, HV=HV, K=K, V=V, W=words["W"], NP=NP, L2NORM=True, PRECISION=precision, WORD_BITS=WORD_BITS,
                  PDL=False, HAS_NUM=True, BV=min(cfg.block_v, V), BK=min(cfg.block_k, K), RANK_ONE=cfg.rank_one,
                  PB=RANK_ONE_BLOCK if cfg.rank_one else PATH_BLOCK, TMA=cfg.tma)
    out.append(("commit B=64", _gdn_tree_commit_kernel, commit, cfg.num_warps, cfg.num_stages, cfg.max_registers,
                _descriptor_types(("pool",), NP, commit["BK"], commit["BV"], "fp32") if cfg.tma else {}))
    return out


def default_kernel_resources(nodes: int, precision: str) -> list[dict]:
    """One row per default kernel: ``label``, ``regs``, ``stack`` (bytes), ``smem``, ``overcovered`` (products laid
    out over more rows than they have), or ``error``."""
    rows = []
    for label, kernel, constexprs, nw, ns, cap, descs in _default_kernels(nodes, precision):
        try:
            rows.append(dict(label=label, max_registers=cap, **_resources(_compile(kernel, constexprs, nw, ns, cap,
                                                                                   descs))))
        except Exception as exc:  # noqa: BLE001 - reported in the row
            rows.append(dict(label=label, error=f"{type(exc).__name__}: {exc}"[:300]))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--precision", default="tf32", choices=PRECISIONS)
    args = parser.parse_args(argv)
    for row in default_kernel_resources(args.nodes, args.precision):
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
