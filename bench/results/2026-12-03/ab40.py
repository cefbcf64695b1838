"""Twenty-second session, run 40: the fused kernel's tiles (q, k, v, the state, o, delta) through tensor descriptors
(``KernelConfig.tma`` on a fused config) against its per-thread pointer loads, where the library launches the fused
kernel (small batches at N != 64, ``ieee`` at N = 64), random trees, fp32 and bf16 inputs.
Verify + commit (the commit a PDL launch behind the verify, as the benchmark launches it) and verify alone, median
of five interleaved rounds, every pool and graph kept alive; ``diff``: max |difference| / max |default| of o, delta
and the committed state against the library's default configs.
The timing loop moved to ``bench/ab_verify.py`` after the runs (the same code).

Run (GPU): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-03/ab40.py
"""

import torch

from ab_verify import time_variants  # bench/ab_verify.py
from lumotree.optimized import gdn_tree as G

ROUNDS = 5
dev = torch.device("cuda")


def variants(B, N, precision):
    vcfg = G.verify_config(B, 32, N, 128, 128, dev, 16, precision)
    ccfg = G.commit_config(B, 32, N, 128, 128, dev, precision)
    assert not vcfg.split, (B, N, precision)
    out = {"library": (vcfg, ccfg), "fused tma": (vcfg._replace(tma=True), ccfg)}
    if vcfg.block_k != 32:
        out["fused tma, 32-row K, 3 stages"] = (vcfg._replace(tma=True, block_k=32, num_stages=3), ccfg)
    if vcfg.num_stages != 2:
        out["fused tma, 2 stages"] = (vcfg._replace(tma=True, num_stages=2), ccfg)
    out["default again"] = (vcfg, ccfg)
    return out


def run(B, N, precision, dtype=torch.float32):
    time_variants(B, N, precision, variants(B, N, precision), dtype, rounds=ROUNDS)


for case in ((1, 32, "tf32"), (1, 8, "tf32"), (1, 128, "tf32"), (1, 32, "tf32", torch.bfloat16),
             (1, 64, "ieee"), (1, 32, "ieee"), (8, 32, "tf32"), (4, 128, "tf32"), (1, 128, "tf32x3")):
    run(*case)
