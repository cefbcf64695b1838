"""Sixteenth session: every launch form of the GDN tree verify / commit and the tree conv once, eagerly, for
``compute-sanitizer --tool memcheck`` with ``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` (each tensor its own allocation, so
that a read or write past a tensor's end is reported, not only one that leaves the caching allocator's segment: the
illegal-address faults of 2026-12-02d/ab.py at B = 16 came with and without PDL, and only with many graphs'
memory alive). Shapes: Qwen3-Next heads, B in {1, 4, 16, 64}, N in {32, 64, 128}, random trees, fp32 and bf16 inputs,
full trees and mixed sizes (num_nodes), the default configs, the fused kernel, the register caps.

Run (GPU): PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck python3 memcheck.py
"""

import sys

import torch

import gdn_tree as T  # bench/gdn_tree.py
from lumotree.optimized import gdn_tree as G
from lumotree.optimized.conv_tree import tree_conv, tree_conv_commit

CASES = [(16, 64, torch.float32), (64, 64, torch.float32), (1, 64, torch.float32), (4, 64, torch.float32),
         (16, 32, torch.float32), (16, 128, torch.float32), (1, 32, torch.float32), (1, 128, torch.float32),
         (16, 64, torch.bfloat16), (1, 64, torch.bfloat16)]
only = sys.argv[1:]
for B, N, dtype in CASES:
    if only and f"{B}x{N}" not in only:
        continue
    x = T.make_inputs(B, N, "random", seed=B * 1000 + N, dtype=dtype)
    default = T.row_config(x, "tf32")
    configs = {"default": default, "fused": G.KernelConfig(32, 32, 4, 3, False)}
    if default.split:
        configs["scratch32"] = default._replace(scratch16=False, max_registers=0)
    sizes = torch.randint(1, N + 1, (B,), device="cuda", dtype=torch.int32)
    accepted_sized = (x["accepted"].long() % sizes.long()).to(torch.int32)  # inside each request's tree
    for name, cfg in configs.items():
        for num_nodes, accepted in ((None, x["accepted"]), (sizes, accepted_sized)):
            for pdl in (True, False):
                pool = x["pool"].clone()
                o, f = G.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], pool, x["slots"], x["parents"],
                                         num_nodes=num_nodes, use_qk_l2norm_in_kernel=True, input_precision="tf32",
                                         config=cfg, launch_dependents=pdl, pdl=pdl)
                G.gdn_tree_commit(pool, x["slots"], f, x["parents"], accepted, num_nodes=num_nodes,
                                  input_precision="tf32", pdl=pdl)
                torch.cuda.synchronize()
                print(f"B {B} N {N} {str(dtype)[6:]} {name} sizes {num_nodes is not None} pdl {pdl}: ok "
                      f"{float(o.float().norm()):.3e}", flush=True)
    conv_x = torch.randn(B, N, 512, device="cuda", dtype=dtype)  # [B, N, C]
    conv_pool = torch.randn(B, 3, 512, device="cuda", dtype=dtype)  # [P, W - 1, C]
    weight = torch.randn(512, 4, device="cuda", dtype=dtype)  # [C, W]
    for num_nodes, accepted in ((None, x["accepted"]), (sizes, accepted_sized)):
        y = tree_conv(conv_x, weight, conv_pool, x["slots"], x["parents"], num_nodes=num_nodes)
        tree_conv_commit(conv_pool, x["slots"], conv_x, x["parents"], accepted, num_nodes=num_nodes)
        torch.cuda.synchronize()
        print(f"B {B} N {N} conv sizes {num_nodes is not None}: ok {float(y.float().norm()):.3e}", flush=True)
print("memcheck script done")
