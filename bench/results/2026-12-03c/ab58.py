"""Twenty-fifth session, run 58: launch configs of verify with bf16 q / k / v (the model's activations; gates and the
state pool fp32), tf32, at B = 64 and B = 1, N = 64. Every default was chosen on fp32 inputs (docs/gdn-kernels-log.md,
"Where the defaults come from"); with 16-bit tiles the apply's K loop moves half the q / k bytes, so the block sizes,
stages and register cap may pick differently.

Run (GPU): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-03c/ab58.py
"""

import torch

import gdn_tree as T
from ab_verify import time_variants
from lumotree.optimized import gdn_tree as G

H, HV, K, V, N = 16, 32, 128, 128, 64
dev = torch.device("cuda")
bf16 = torch.bfloat16


def compiles(B, vcfg, ccfg) -> bool:
    """The variant runs (a config that fails to compile is left out, with its error printed)."""
    x = T.make_inputs(B, N, "random", seed=1, dtype=bf16)
    try:
        o, f = G.gdn_tree_verify(x["q"], x["k"], x["v"], x["g"], x["beta"], x["pool"], x["slots"], x["parents"],
                                 use_qk_l2norm_in_kernel=True, input_precision="tf32", config=vcfg)
        G.gdn_tree_commit(x["pool"], x["slots"], f, x["parents"], x["accepted"], input_precision="tf32",
                          config=ccfg)
        torch.cuda.synchronize()
        return True
    except Exception as exc:  # noqa: BLE001
        print(f"B = {B} {tuple(vcfg)}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        return False


for B in (64, 1):
    d = G.verify_config(B, HV, N, K, V, dev, H, "tf32", bf16)
    c = G.commit_config(B, HV, N, K, V, dev)
    print(f"B = {B} default verify {tuple(d)} commit {tuple(c)}", flush=True)
    if B == 64:
        table = {"default": (d, c),
                 "2 stages": (d._replace(num_stages=2), c),
                 "4 stages": (d._replace(num_stages=4), c),
                 "32 columns, cap 128 (the fp32 B = 32 form)": (d._replace(block_v=32, max_registers=128,
                                                                          early_signal=True), c),
                 "128 columns, 8 warps": (d._replace(block_v=128, num_warps=8), c),
                 "K chunks of 64": (d._replace(block_k=64, num_stages=2), c),
                 "no descriptors in the apply": (d._replace(tma=False), c),
                 "fp32 Gram products": (d._replace(dot16=False), c),
                 "early signal": (d._replace(early_signal=True), c)}
    else:
        table = {"default": (d, c),
                 "fused kernel, 32 columns, 3 stages": (G.KernelConfig(32, 32, 4, 3, False, tma=False), c),
                 "fused kernel, descriptors": (G.KernelConfig(32, 32, 4, 3, False, tma=True), c),
                 "apply 4 stages": (d._replace(num_stages=4), c),
                 "apply 16 columns": (d._replace(block_v=16), c),
                 "apply 64 columns": (d._replace(block_v=64), c),
                 "apply descriptors": (d._replace(tma=True), c)}
    table = {name: cfgs for name, cfgs in table.items() if compiles(B, *cfgs)}
    time_variants(B, N, "tf32", table, dtype=bf16, rounds=3)
