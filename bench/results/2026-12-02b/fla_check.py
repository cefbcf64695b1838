"""Thirteenth session, run 6: are fla 0.6.0's baselines right on this stack (Triton 3.6, H200)?

Run 5 found fla's fused_recurrent over the tree's paths (branch by branch) 66 % off the float64 closed form at B = 1
on the one batch where it did not fault. This checks, each against the float64 closed form of the same inputs
(``lumotree.optimized.gdn_tree_ref``, tested against the exact reference), and times with CUDA-graph replay:

- fla's decode step (T = 1, the benchmark's denominator) against the root's output;
- fla's chunk kernel on chains against every node's output;
- branch by branch as the benchmark launches it (fused_recurrent, 3 pipeline stages) and with the kernel's
  launch set to 1 stage (the wrapper hard-codes 3; a proxy in front of the kernel object replaces it), at B = 1 and
  B = 64, random and EAGLE trees. Each branch job runs in its own process, because a fault ends the process.

Run (GPU): PYTHONPATH=$PWD:$PWD/bench:<fla site> python3 bench/results/2026-12-02b/fla_check.py --out check.json
"""

import argparse
import json
import subprocess
import sys

import torch

import gdn_tree as T  # bench/gdn_tree.py
from lumotree.optimized import gdn_tree_ref as R


class Stages:
    """A Triton kernel object whose launches use ``num_stages=stages`` whatever the caller passes."""

    def __init__(self, kernel, stages: int):
        self.kernel, self.stages = kernel, stages

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def run(*args, **kwargs):
            kwargs["num_stages"] = self.stages
            return launch(*args, **kwargs)

        return run


def closed_form(x, sub: int):
    args = [x[n][:sub].double() for n in ("q", "k", "v", "g", "beta")]
    ro, _ = R.gdn_tree_closed_form_ref(*args, x["pool"].double(), x["slots"][:sub], x["parents"][:sub],
                                       use_qk_l2norm=True)
    return ro  # [sub, N, HV, V]


def rel(a, b) -> float:
    return float((a.double() - b).norm() / b.norm())


def job(method: str, B: int, kind: str, stages: int) -> dict:
    import fla.ops.gated_delta_rule as fla  # noqa: PLC0415
    import fla.ops.gated_delta_rule.fused_recurrent as FR  # noqa: PLC0415

    if stages != 3:
        FR.fused_recurrent_gated_delta_rule_fwd_kernel = Stages(FR.fused_recurrent_gated_delta_rule_fwd_kernel, stages)
    x = T.make_inputs(B, 64, kind, seed=B * 1000 + 64)
    ar, branch, chunk, paths = T.fla_fns(x, fla)
    fn = dict(ar=ar, branch=branch, chunk=chunk)[method]
    fn()
    torch.cuda.synchronize()
    sub = min(B, 4)
    ro = closed_form(x, sub)
    if method == "ar":
        err = rel(fn()[0][:sub, 0], ro[:, 0])
    elif method == "chunk":
        err = rel(fn()[0][:sub], ro)
    else:
        err = T.branch_error(x, fn)
    us, graph = T.graph_time(fn, rep_ms=60)
    return dict(method=method, B=B, kind=kind, stages=stages, paths=paths, err_o=err, us=us, graph=graph)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="check.json")
    parser.add_argument("--job", nargs=4)
    args = parser.parse_args()
    if args.job:
        method, B, kind, stages = args.job
        print(json.dumps(job(method, int(B), kind, int(stages))), flush=True)
        return 0
    jobs = [("ar", 64, "random", 3), ("ar", 1, "random", 3), ("chunk", 1, "chain", 3),
            ("branch", 1, "random", 3), ("branch", 1, "random", 1), ("branch", 1, "eagle", 1),
            ("branch", 64, "random", 1), ("branch", 64, "eagle", 1), ("chunk", 64, "chain", 3)]
    rows = []
    for j in jobs:
        try:
            proc = subprocess.run([sys.executable, __file__, "--job", *map(str, j)], capture_output=True, text=True,
                                  timeout=100)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            row = json.loads(lines[-1]) if lines else dict(zip(("method", "B", "kind", "stages"), j),
                                                           error=(proc.stdout + proc.stderr)[-400:])
        except subprocess.TimeoutExpired:
            row = dict(zip(("method", "B", "kind", "stages"), j), error="timeout (100 s)")
        rows.append(row)
        print(json.dumps(row), flush=True)
        json.dump(dict(card=torch.cuda.get_device_name(), rows=rows), open(args.out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
