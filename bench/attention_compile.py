"""Compile-only resource report of the tree attention kernel for sm_90 (no GPU needed).

For each (BLOCK_M, BLOCK_N, num_warps, num_stages, FINALIZE) it compiles ``_tree_attn_kernel`` at the Qwen3-Next shape
(G = 8, D = 256, bf16, gate fused) with the divisibility the JIT infers on the device (16-aligned pointers and
strides), assembles the PTX with the ptxas bundled with the Triton in use and prints registers, spills, shared
memory, and whether the q tile is stored to shared memory before the first K/V ``cp.async`` (one serialised global
round trip before the first key tile). Run: ``PYTHONPATH=$PWD python bench/attention_compile.py [--json PATH]``.
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

from lumotree.optimized import tree_attention as ta

CONFIGS = [  # (block_m, block_n, num_warps, num_stages, finalize)
    (128, 32, 8, 3, False), (128, 32, 8, 3, True), (128, 64, 8, 2, True), (64, 32, 4, 2, False),
    (64, 32, 4, 3, False), (64, 32, 8, 3, False), (16, 32, 4, 4, False),
]
POINTERS = {"Q": "*bf16", "KC": "*bf16", "VC": "*bf16", "Gate": "*bf16", "Words": "*i32", "Slots": "*i32",
            "Lens": "*i32", "Out": "*bf16", "PartAcc": "*fp32", "PartML": "*fp32"}
UNALIGNED = {"spm_s", "spm_b", "spm_n", "spm_h", "N", "NW", "NUM_SPLITS", "TREE_SLACK", "swb", "swn"}


def compile_config(block_m: int, block_n: int, num_warps: int, num_stages: int, finalize: bool,
                   pdl: bool = False) -> dict:
    kernel = ta._tree_attn_kernel
    const = dict(G=8, FINALIZE=finalize, HAS_GATE=True, IEEE=False, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=256,
                 EVEN_D=True, SKIP_EMPTY=not finalize and block_m > 16, PDL=pdl, KV_LINES=4, LINE_ELEMS=64)
    signature, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in const:
            signature[name] = "constexpr"
        elif name in POINTERS:
            signature[name] = POINTERS[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name == "qk_scale":
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
            if name not in UNALIGNED:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=kernel, signature=signature, constexprs=const, attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 128),
                              options=dict(num_warps=num_warps, num_stages=num_stages))
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        ptx = os.path.join(tmp, "k.ptx")
        with open(ptx, "w") as f:
            f.write(compiled.asm["ptx"])
        log = subprocess.run([ptxas, "-arch=sm_90a", "-v", ptx, "-o", os.path.join(tmp, "k.cubin")],
                             capture_output=True, text=True).stderr
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores", log)
    ttgir = compiled.asm["ttgir"]
    q_alloc = ttgir.find("ttg.local_alloc %q")
    first_async = ttgir.find("async_copy_global_to_local")
    return {"config": [block_m, block_n, num_warps, num_stages, finalize], "pdl": pdl, "triton": triton.__version__,
            "registers": int(regs.group(1)) if regs else None, "spill_bytes": int(spills.group(1)) if spills else None,
            "shared_kib": compiled.metadata.shared / 1024, "wgmma": compiled.asm["ptx"].count("wgmma.mma_async"),
            "q_smem_before_first_kv_copy": 0 <= q_alloc < first_async, "ptxas_log": None if regs else log[-300:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--pdl", action="store_true", help="the PDL form (K / V prefetch before the wait)")
    args = ap.parse_args()
    rows = []
    for cfg in CONFIGS:
        try:
            row = compile_config(*cfg, pdl=args.pdl)
        except Exception as e:  # a config that does not compile is a result too
            row = {"config": list(cfg), "error": repr(e)[:300]}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if v is not None}), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
