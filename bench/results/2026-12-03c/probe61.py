"""Twenty-fifth session, run 61 (not run: the session's device time ran out; for the next session): which launch
faults (illegal address, run 60) when ``row_halves.patch``'s small-batch form verifies the GPU test's case
(tests/test_gdn_kernels.py::test_gpu_qwen_shapes_error_bounds: six gated trees of sizes 64, 64, 17, 128, 1 and 100,
Qwen3-Next shapes, tf32). Each form runs in its own process with ``CUDA_LAUNCH_BLOCKING=1`` (the traceback then
names the faulting launch): the failing form itself, with the apply through pointers, with the one-program solve
behind the same descriptor apply, with a 4-warp rows solve, ungated, and on six full trees without sizes.

Run (GPU, the patch applied): PYTHONPATH=$PWD:$PWD/bench python3 bench/results/2026-12-03c/probe61.py
"""

import os
import subprocess
import sys

CASE = r'''
import sys, numpy as np, torch
sys.path.insert(0, "tests")
import test_gdn_kernels as T
from lumotree.optimized import gdn_tree as G
gated, sizes, changes = {gated}, "{sizes}", {changes}
rng = np.random.default_rng(0)
rows = T._gpu_rows(7) if sizes == "mixed" else [T.build_tree_parents("random", 128, rng) for _ in range(6)]
case = T.make_case(rows, **T.QWEN, gated=gated, seed=11)
cfg = G.KernelConfig(64, 32, 8, 2, True, 8, solve_stages=2, apply_pdl=True, tma=True, halves=True, row_halves=True)
cfg = cfg._replace(**changes)
o, f = T.run_verify(case, l2norm=True, gated=gated, neg=gated, precision="tf32", config=cfg)
torch.cuda.synchronize()
print("ok", float(o.float().abs().max()))
'''
FORMS = [("the failing form", True, "mixed", {}),
         ("apply through pointers", True, "mixed", {"tma": False}),
         ("one-program solve, same apply", True, "mixed", {"row_halves": False}),
         ("rows solve at 4 warps", True, "mixed", {"solve_warps": 4}),
         ("ungated", False, "mixed", {}),
         ("six full trees, no sizes", True, "full", {})]
for name, gated, sizes, changes in FORMS:
    if os.environ.get("PROBE_SCRIPT"):  # only write the failing form's script there (for compute-sanitizer)
        with open(os.environ["PROBE_SCRIPT"], "w") as f:
            f.write(CASE.format(gated=gated, sizes=sizes, changes=changes))
        break
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    r = subprocess.run([sys.executable, "-c", CASE.format(gated=gated, sizes=sizes, changes=changes)], env=env,
                       capture_output=True, text=True, timeout=90)
    lines = (r.stdout + r.stderr).strip().splitlines()
    where = [ln.strip() for ln in lines if "gdn_tree.py" in ln or "Error" in ln][-3:]
    print(f"{name}: rc {r.returncode} {lines[-1][:200] if lines else ''} | {' | '.join(where)[:500]}", flush=True)
