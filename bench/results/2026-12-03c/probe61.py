"""Twenty-fifth session, run 61: which launch of the split rows pipeline faults (illegal address) on the GPU test's
case (tests/test_gdn_kernels.py::test_gpu_qwen_shapes_error_bounds, six trees of mixed sizes up to 128 nodes),
each form in its own process with CUDA_LAUNCH_BLOCKING=1. Not run: the session's device time ran out before it
(kept for the next session)."""

import os
import subprocess
import sys

CASE = r'''
import sys, torch
sys.path.insert(0, "tests")
import test_gdn_kernels as T
from lumotree.optimized import gdn_tree as G
gated, rows_on, sizes = {gated}, {rows_on}, "{sizes}"
rng = __import__("numpy").random.default_rng(0)
rows = T._gpu_rows(7) if sizes == "mixed" else [T.build_tree_parents("random", 128, rng) for _ in range(6)]
case = T.make_case(rows, **T.QWEN, gated=gated, seed=11)
cfg = G.verify_config(6, 32, 128, 128, 128, torch.device("cuda"), 16, "tf32")._replace(row_halves=rows_on)
o, f = T.run_verify(case, l2norm=True, gated=gated, neg=gated, precision="tf32", config=cfg)
torch.cuda.synchronize()
print("ok", float(o.float().abs().max()))
'''
for gated, rows_on, sizes in ((True, True, "mixed"), (False, True, "mixed"), (True, False, "mixed"),
                              (True, True, "full")):
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    r = subprocess.run([sys.executable, "-c", CASE.format(gated=gated, rows_on=rows_on, sizes=sizes)], env=env,
                       capture_output=True, text=True, timeout=60)
    tail = (r.stdout + r.stderr).strip().splitlines()[-3:]
    print(f"gated={gated} rows={rows_on} sizes={sizes}: rc {r.returncode} {' | '.join(tail)[:600]}", flush=True)
