"""Twenty-third session, run 48: the split pipeline's apply as a persistent kernel (``KernelConfig.persistent``
programs per SM, each looping over its (V block, request, value head) items in one flattened loop over (item, K
chunk), so that the next item's first chunks load under the current item's tail) against the default (one program
per item), N = 64, tf32, fp32 inputs, B = 64 and 16. Compile-only (Triton 3.6, sm_90): B = 64's 64-column apply 162
registers (3 per SM) -> 194 persistent (2 per SM), 168 with 8 bytes of stack capped; B = 16's 32-column apply at
the 128 cap: 16 bytes of stack.

Run (GPU), with persistent_apply.patch beside this file applied (the form was measured slower and not kept):
PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-03b/ab48.py
"""

import torch

from ab_verify import time_variants
from lumotree.optimized import gdn_tree as G

H, HV, K, V = 16, 32, 128, 128
dev = torch.device("cuda")
for B, variants in ((64, {"persist2": dict(persistent=2), "persist2 s2": dict(persistent=2, num_stages=2),
                          "persist3 cap168": dict(persistent=3, max_registers=168),
                          "persist3 cap168 s2": dict(persistent=3, max_registers=168, num_stages=2),
                          "persist3 cap168 signal": dict(persistent=3, max_registers=168, early_signal=True)}),
                    (16, {"persist4": dict(persistent=4), "persist4 s2": dict(persistent=4, num_stages=2),
                          "persist3": dict(persistent=3)})):
    default = G.verify_config(B, HV, 64, K, V, dev, H, "tf32")
    commit = G.commit_config(B, HV, 64, K, V, dev)
    table = {"default": (default, commit)}
    table.update({name: (default._replace(**change), commit) for name, change in variants.items()})
    time_variants(B, 64, "tf32", table, rounds=3)
