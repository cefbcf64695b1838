"""Twenty-first session, runs 35-39: tensor descriptors (Hopper's TMA) for the split pipeline's apply and for the commit
(``KernelConfig.tma``), then for the solve's q / k (``solve_tma``), against the per-thread pointer loads, random trees;
runs 35-36 at N = 64, tf32, B = 64, 16 and 1; run 37 the other modes and sizes; run 39 the descriptor apply's
occupancy at B = 64.
Verify + commit (the commit a PDL launch behind the verify, as the benchmark launches it) and verify alone, median
of five interleaved rounds, every pool and graph kept alive; ``diff``: max |difference| / max |default| of o, delta
and the committed state against the library's default configs.
The timing loop moved to ``bench/ab_verify.py`` after the runs (the same code).

Run (GPU): PYTHONPATH=$PWD:$PWD/bench AB_RUN=35|36|37|39 python3 bench/results/2026-12-03/ab35.py [B ...]
"""

import os
import sys

import torch

from ab_verify import time_variants  # bench/ab_verify.py
from lumotree.optimized import gdn_tree as G

N, ROUNDS = 64, 5
RUN = int(os.environ.get("AB_RUN", "35"))
dev = torch.device("cuda")


def variants(B, N, precision):
    vcfg = G.verify_config(B, 32, N, 128, 128, dev, 16, precision)
    ccfg = G.commit_config(B, 32, N, 128, 128, dev, precision)
    if RUN == 39:  # the descriptor apply's occupancy: 4 programs per SM at 2 stages and the 128 cap, or 8 warps
        out = {"library": (vcfg, ccfg),
               "apply 2 stages, capped at 128": (vcfg._replace(num_stages=2, max_registers=128), ccfg),
               "apply 8 warps": (vcfg._replace(num_warps=8), ccfg)}
    elif RUN == 37:
        out = {"library": (vcfg, ccfg)}
        if vcfg.split:
            out["pointers"] = (vcfg._replace(tma=False, solve_tma=False), ccfg)
            out["solve tma"] = (vcfg._replace(tma=False, solve_tma=True), ccfg)
            out["apply + solve tma"] = (vcfg._replace(tma=True, solve_tma=True), ccfg)
        if (B, N, precision) == (64, 64, "tf32"):
            both = vcfg._replace(tma=True, solve_tma=True)
            out["both, solve 2 stages"] = (both._replace(solve_stages=2), ccfg)
            out["both, solve 4 stages"] = (both._replace(solve_stages=4), ccfg)
            out["both, early signal"] = (both._replace(early_signal=True), ccfg)
    elif RUN == 35:
        out = {"default": (vcfg, ccfg), "apply tma": (vcfg._replace(tma=True), ccfg),
               "commit tma": (vcfg, ccfg._replace(tma=True)),
               "both tma": (vcfg._replace(tma=True), ccfg._replace(tma=True))}
        if B >= 64:  # the 32-column apply (124 registers with descriptors: 4 programs per SM uncapped)
            narrow = vcfg._replace(block_v=32, max_registers=0, early_signal=True, tma=True)
            out["both tma, 32-column apply"] = (narrow, ccfg._replace(tma=True))
            out["both tma, 32-column apply, late commit"] = (narrow._replace(early_signal=False),
                                                             ccfg._replace(tma=True))
            out["both tma, commit uncapped"] = (vcfg._replace(tma=True), ccfg._replace(tma=True, max_registers=0))
    else:  # run 36: the solve's q / k through descriptors too, the apply's stages and K chunks
        tma = vcfg._replace(tma=True)
        out = {"default": (vcfg, ccfg), "apply tma": (tma, ccfg), "solve tma": (vcfg._replace(solve_tma=True), ccfg),
               "apply + solve tma": (tma._replace(solve_tma=True), ccfg)}
        if B >= 16:
            out["apply tma, 2 stages"] = (tma._replace(num_stages=2), ccfg)
            out["apply tma, 4 stages"] = (tma._replace(num_stages=4), ccfg)
            out["apply tma, 16-row K chunks, 4 stages"] = (tma._replace(block_k=16, num_stages=4), ccfg)
    out["default again"] = (vcfg, ccfg)
    return out


def run(B, N=64, precision="tf32"):
    time_variants(B, N, precision, variants(B, N, precision), rounds=ROUNDS)


if RUN == 39:
    run(64)
elif RUN == 37:
    for case in ((64, 64, "tf32"), (64, 64, "tf32x3"), (64, 64, "ieee"), (1, 64, "tf32x3"), (1, 64, "ieee"),
                 (64, 32, "tf32"), (64, 128, "tf32"), (16, 128, "tf32"), (64, 8, "tf32"), (64, 128, "ieee")):
        run(*case)
else:
    for B in [int(a) for a in sys.argv[1:]] or [64, 16, 1]:
        run(B)
