"""Compile-only resource analysis of the GDN tree kernels for Hopper (sm_90), no GPU needed.

For each kernel variant and launch configuration: registers per thread, stack (spill) bytes and shared memory from
``cuobjdump -res-usage`` on the cubin Triton builds for ``GPUTarget("cuda", 90, 128)``, and the number of ``wgmma``
/ ``mma`` / ``cp.async`` instructions in the PTX. Qwen3-Next shapes (H=16, HV=32, K=V=128), fp32 inputs, q/k L2 norm
in the kernel, precomputed gates.

Run: ``PYTHONPATH=$PWD python bench/gdn_regs.py [--nodes 64] [--precision tf32] [--only fused,commit] [--gate]
[--aligned] [--out PATH]`` (each config's register cap, ``KernelConfig.max_registers``, applied).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from lumotree.optimized import gdn_tree as G

H, HV, K, V = 16, 32, 128, 128
H200_SMS = 132
INT_POINTERS = ("slots_ptr", "words_ptr", "depth_ptr", "num_nodes_ptr", "accepted_ptr", "ready_ptr")
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def compile_for_hopper(kernel, constexprs: dict, num_warps: int, num_stages: int, *, aligned: bool = False,
                       maxnreg: int = 0, descs: dict | None = None):
    """Triton's compile for sm_90 of ``kernel`` with every pointer fp32 (int32 for the index arrays; fp16 for the
    split pipeline's scratch with ``SCRATCH16``). ``aligned``: every pointer 16-byte aligned and every integer
    argument divisible by 16, as the JIT specialises them at B = 64 (without it the compile shows scalar loads and
    other register counts than the GPU runs). ``maxnreg``: the register cap (``KernelConfig.max_registers``).
    ``descs``: the tensor-descriptor arguments' types (``"tensordesc<fp32[128, 64]>"``); the others are None."""
    descs = descs or {}
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
             if aligned and signature[name] not in ("constexpr", "fp32") and name not in descs}
    src = ASTSource(fn=kernel, signature=signature,
                    constexprs={(kernel.arg_names.index(n),): v for n, v in constexprs.items()}, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 128),
                          options=dict(num_warps=num_warps, num_stages=num_stages,
                                       **({"maxnreg": maxnreg} if maxnreg else {})))


def overcovered_products(ttgir: str) -> int:
    """Products whose MMA layout spans more rows than their result has (``warpsPerCTA[0]`` warps of 16 rows each
    against M): Triton (3.6) lays out a product that feeds another one with all warps along M, and at 8 warps on a
    64-row tile the second warpgroup's operand reads pass the tile (an out-of-range shared read on the H200, run 61
    of the twenty-sixth session)."""
    warps_m = {name: int(m) for name, m in
               re.findall(r"^(#mma\d*) = #ttg\.nvidia_mma<\{.*?warpsPerCTA = \[(\d+), \d+\]", ttgir, re.M)}
    rows = re.findall(r"(?:ttng\.warp_group_dot|tt\.dot) .*-> tensor<(\d+)x\d+x\w+, (#mma\d*)>", ttgir)
    return sum(int(m) < 16 * warps_m[layout] for m, layout in rows)


def resources(compiled) -> dict:
    """REG / STACK / SHARED of the cubin, instruction counts of the PTX and :func:`overcovered_products`."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        text = subprocess.run([CUOBJDUMP, "-res-usage", f.name], capture_output=True, text=True).stdout
    usage = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", text))
    ptx = compiled.asm["ptx"]
    return dict(regs=int(usage.get("REG", -1)), stack=int(usage.get("STACK", -1)),
                smem=int(compiled.metadata.shared), wgmma=ptx.count("wgmma.mma_async"),
                mma=len(re.findall(r"\bmma\.sync", ptx)), cp_async=ptx.count("cp.async"),
                overcovered=overcovered_products(compiled.asm["ttgir"]))


def tma_types(names: tuple, NP: int, bk: int, bv: int, scratch: str) -> dict:
    """Descriptor argument types (``compile_for_hopper``'s ``descs``) of the kernels' tensor descriptors, as
    ``gdn_tree._tma_descriptors`` builds them for fp32 inputs: the pools' ``[BK, BV]`` state tiles, q / k / v / o /
    delta ``[1, NP, 1, B*]`` node tiles, the scratch ``[NP, NP]`` tiles in ``scratch`` (fp16 or fp32)."""
    blocks = dict(pool=f"fp32[{bk}, {bv}]", q=f"fp32[1, {NP}, 1, {bk}]", k=f"fp32[1, {NP}, 1, {bk}]",
                  v=f"fp32[1, {NP}, 1, {bv}]", tb=f"{scratch}[{NP}, {NP}]", qkd=f"{scratch}[{NP}, {NP}]",
                  o=f"fp32[1, {NP}, 1, {bv}]", delta=f"fp32[1, {NP}, 1, {bv}]")
    return {f"{n}_desc": f"tensordesc<{blocks[n]}>" for n in names}


def variants(N: int, precision: str, gate: bool = False):
    """(label, kernel, constexprs, warps, stages, register cap, descriptor types) of the default configs and of
    every variant that bench/gdn_probe.py times (its config tables are the one list). ``gate``: verify with the
    output gate (``gdn_tree.OutputGate``) in its epilogue."""
    import gdn_probe  # noqa: PLC0415 - bench/ is on sys.path when this file runs as a script

    NP = max(16, triton.next_power_of_2(N))
    flags = dict(H=H, HV=HV, K=K, NP=NP, GATED=False, BETA_TWO=False, L2NORM=True, PRECISION=precision, QK16=False)
    words = dict(W=(N + 31) // 32, LOG_NP=NP.bit_length() - 1, WORD_BITS=32)
    G._NUM_SMS[0] = H200_SMS  # the default configs as chosen on the H200 (no GPU here to ask)
    h200 = torch.device("cuda", 0)
    defaults = {f"default_B{B}": G.verify_config(B, HV, N, K, V, h200, H, precision) for B in (1, 64)}
    configs = {**defaults, **gdn_probe.VERIFY_LARGE, **gdn_probe.VERIFY_SMALL}
    out, seen = [], set()
    for name, cfg in configs.items():
        bv, bk = min(cfg.block_v, V), min(cfg.block_k, K)
        flags["WORD_VECTORS"] = cfg.word_vectors
        if cfg.split:  # PDL as the config asks (the apply waits after its pass over S0)
            scratch16 = bool(cfg.scratch16) and precision == "tf32"
            solve = dict(flags, **words, BK=bk, HEADS=cfg.solve_heads, DOT16=False, PDL=cfg.apply_pdl, HAS_NUM=True,
                         SCRATCH16=scratch16, TMA=cfg.solve_tma, **G._solve_flags(cfg, NP))
            apply = dict(H=H, HV=HV, K=K, NP=NP, L2NORM=True, PRECISION=precision, QK16=False, V=V, BK=bk, BV=bv,
                         GATE=gate, PIECE=G.GATE_PIECE, PDL=cfg.apply_pdl, SIGNAL=False, HAS_NUM=True,
                         SCRATCH16=scratch16, TMA=cfg.tma)
            scratch = "fp16" if scratch16 else "fp32"
            apply_descs = ("pool", "q", "k", "v", "tb", "qkd") + (() if gate else ("o", "delta"))
            solve_part = ("solve", G._gdn_tree_solve_kernel, solve, cfg.solve_warps, 0,
                          tma_types(("q", "k"), NP, bk, bv, scratch) if cfg.solve_tma else {})
            if G._row_halves(cfg, NP):  # the solve by row halves: the constexprs it takes (no heads, descriptors)
                rows = {n: v for n, v in solve.items() if n in G._gdn_tree_solve_rows_kernel.arg_names}
                solve_part = ("solve rows", G._gdn_tree_solve_rows_kernel, rows, cfg.solve_warps, 0, {})
            parts = [solve_part,
                     ("apply", G._gdn_tree_apply_kernel, apply, cfg.num_warps, cfg.max_registers,
                      tma_types(apply_descs, NP, bk, bv, scratch) if cfg.tma else {})]
        else:
            fused = dict(flags, **words, V=V, BK=bk, BV=bv, DOT16=False, PDL=False, STATE_LINES=1, GATE=gate,
                         PIECE=G.GATE_PIECE, SIGNAL=False, HAS_NUM=True, TMA=cfg.tma, **G._fused_flags(cfg, NP))
            fused_descs = ("pool", "q", "k", "v") + (() if gate else ("o", "delta"))
            parts = [("fused", G._gdn_tree_verify_kernel, fused, cfg.num_warps, 0,
                      tma_types(fused_descs, NP, bk, bv, "fp32") if cfg.tma else {})]
        for part, kernel, constexprs, nw, cap, descs in parts:
            key = (part, tuple(sorted(constexprs.items())), nw, cfg.num_stages, cap)
            if key not in seen:
                seen.add(key)
                out.append((f"verify {name} [{part}]", kernel, constexprs, nw, cfg.num_stages, cap, descs))
    commit = dict(H=H, HV=HV, K=K, V=V, W=words["W"], NP=NP, L2NORM=True, PRECISION=precision,
                  WORD_BITS=32, PDL=False, HAS_NUM=True)
    commit_defaults = {f"default_B{B}": G.commit_config(B, HV, N, K, V, h200, precision) for B in (1, 64)}
    for name, cfg in {**commit_defaults, **gdn_probe.COMMIT_LARGE, **gdn_probe.COMMIT_SMALL}.items():
        out.append((f"commit {name}", G._gdn_tree_commit_kernel,
                    dict(commit, BV=min(cfg.block_v, V), BK=min(cfg.block_k, K), RANK_ONE=cfg.rank_one,
                         PB=G.RANK_ONE_BLOCK if cfg.rank_one else G.PATH_BLOCK, TMA=cfg.tma), cfg.num_warps,
                    cfg.num_stages, cfg.max_registers,
                    tma_types(("pool",), NP, min(cfg.block_k, K), min(cfg.block_v, V), "fp32") if cfg.tma else {}))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--precision", default="tf32", choices=G.PRECISIONS)
    parser.add_argument("--only", default="", help="comma-separated label prefixes (verify, commit)")
    parser.add_argument("--gate", action="store_true", help="verify with the output gate in its epilogue")
    parser.add_argument("--aligned", action="store_true",
                        help="pointers and integer arguments divisible by 16, as the JIT specialises them at B = 64")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    rows = []
    for label, kernel, constexprs, nw, ns, cap, descs in variants(args.nodes, args.precision, args.gate):
        if args.only and not any(label.startswith(p) for p in args.only.split(",")):
            continue
        try:
            compiled = compile_for_hopper(kernel, constexprs, nw, ns, aligned=args.aligned, maxnreg=cap, descs=descs)
            row = dict(label=label, max_registers=cap, **resources(compiled))
        except Exception as exc:  # noqa: BLE001 - record and go on
            row = dict(label=label, error=f"{type(exc).__name__}: {exc}"[:300])
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(nodes=args.nodes, precision=args.precision, gate=args.gate, aligned=args.aligned,
                           rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
