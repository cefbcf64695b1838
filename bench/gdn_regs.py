"""Compile-only resource analysis of the GDN tree kernels for Hopper (sm_90), no GPU needed.

For each kernel variant and launch configuration: registers per thread, stack (spill) bytes and shared memory from
``cuobjdump -res-usage`` on the cubin Triton builds for ``GPUTarget("cuda", 90, 128)``, and the number of ``wgmma``
/ ``mma`` / ``cp.async`` instructions in the PTX. Qwen3-Next shapes (H=16, HV=32, K=V=128), fp32 inputs, q/k L2 norm
in the kernel, precomputed gates.

Run: ``PYTHONPATH=$PWD python bench/gdn_regs.py [--nodes 64] [--precision tf32] [--only head,commit] [--out PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from lumotree.optimized import gdn_tree as G

H, HV, K, V = 16, 32, 128, 128
INT_POINTERS = ("slots_ptr", "words_ptr", "depth_ptr", "num_nodes_ptr", "accepted_ptr")
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def compile_for_hopper(kernel, constexprs: dict, num_warps: int, num_stages: int):
    """Triton's compile for sm_90 of ``kernel`` with every pointer fp32 (int32 for the index arrays)."""
    signature = {}
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = "*i32" if name in INT_POINTERS else "*fp32"
        else:
            signature[name] = "fp32" if name == "scale" else "i32"
    src = ASTSource(fn=kernel, signature=signature,
                    constexprs={(kernel.arg_names.index(n),): v for n, v in constexprs.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 128),
                          options=dict(num_warps=num_warps, num_stages=num_stages))


def resources(compiled) -> dict:
    """REG / STACK / SHARED of the cubin and instruction counts of the PTX."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        text = subprocess.run([CUOBJDUMP, "-res-usage", f.name], capture_output=True, text=True).stdout
    usage = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", text))
    ptx = compiled.asm["ptx"]
    return dict(regs=int(usage.get("REG", -1)), stack=int(usage.get("STACK", -1)),
                smem=int(compiled.metadata.shared), wgmma=ptx.count("wgmma.mma_async"),
                mma=len(re.findall(r"\bmma\.sync", ptx)), cp_async=ptx.count("cp.async"))


def variants(N: int, precision: str):
    """(label, kernel, constexprs, warps, stages) of every variant the probe times."""
    NP = max(16, triton.next_power_of_2(N))
    common = dict(H=H, HV=HV, K=K, NP=NP, WORD_BITS=32, GATED=False, BETA_TWO=False, L2NORM=True, PRECISION=precision)
    words = dict(W=(N + 31) // 32, LOG_NP=NP.bit_length() - 1)
    out = []
    for bv, nw in [(16, 4), (32, 4), (64, 4), (64, 8)]:
        out.append((f"fused bv{bv} w{nw}", G._gdn_tree_verify_kernel, dict(common, **words, V=V, BK=32, BV=bv), nw, 2))
    for nw in (4, 8):
        out.append((f"solve w{nw}", G._gdn_tree_solve_kernel, dict(common, **words, BK=32), nw, 2))
    for bv, nw in [(16, 4), (32, 4), (64, 4)]:
        c = {k: v for k, v in common.items() if k not in ("WORD_BITS", "GATED", "BETA_TWO")}
        out.append((f"apply bv{bv} w{nw}", G._gdn_tree_apply_kernel, dict(c, V=V, BK=32, BV=bv), nw, 2))
    for hpp in (1, 2):
        for bv, nw in [(32, 4), (32, 8), (64, 8), (128, 8)]:
            out.append((f"head hpp{hpp} bv{bv} w{nw}", G._gdn_tree_verify_head_kernel,
                        dict(common, **words, V=V, BK=32, BV=bv, HPP=hpp), nw, 2))
    commit = dict(H=H, HV=HV, K=K, V=V, W=words["W"], NP=NP, PB=G.PATH_BLOCK, L2NORM=True, PRECISION=precision,
                  WORD_BITS=32)
    for bv, bk, nw in [(64, 128, 4), (32, 128, 4), (64, 32, 4), (128, 32, 4), (64, 64, 4), (32, 32, 2)]:
        out.append((f"commit bv{bv} bk{bk} w{nw}", G._gdn_tree_commit_kernel, dict(commit, BV=bv, BK=bk), nw, 1))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--precision", default="tf32", choices=G.PRECISIONS)
    parser.add_argument("--only", default="", help="comma-separated label prefixes (fused, solve, apply, head, commit)")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    rows = []
    for label, kernel, constexprs, nw, ns in variants(args.nodes, args.precision):
        if args.only and not any(label.startswith(p) for p in args.only.split(",")):
            continue
        try:
            row = dict(label=label, **resources(compile_for_hopper(kernel, constexprs, nw, ns)))
        except Exception as exc:  # noqa: BLE001 - record and go on
            row = dict(label=label, error=f"{type(exc).__name__}: {exc}"[:300])
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(nodes=args.nodes, precision=args.precision, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
