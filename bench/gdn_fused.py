"""Benchmark: the fused GDN tree step (issue 5's B = 64 target) against the split one and fla's decode step.

One Gated DeltaNet layer at Qwen3-Next shapes (H = 16, HV = 32, K = V = 128), trees of 64 nodes (the benchmark's
random trees, ``bench/gdn_tree.py``), q / k L2-normalised in the kernels, fp32 inputs, one GPU. Timed side by side
in one run, CUDA-graph medians:

- ``fused``: one step in steady state: :func:`~lumotree.optimized.gdn_tree_fused.gdn_tree_verify_fused` (the
  previous step's recorded commit applied to each state chunk as it is streamed, written back, and this step's
  tree verified from it) plus :func:`~lumotree.optimized.gdn_tree_pending.gdn_tree_record` of the accepted
  nodes (``bench/gdn_tree.py``'s: depth about half the tree's); ``fused_verify`` alone, and the record's share
  of the step (``step - verify``: timed alone, each replay of a record would first apply the previous one);
- ``split``: the library's ``tf32`` verify + commit (``gdn_tree_verify`` + ``gdn_tree_commit``, the commit as a
  PDL launch behind the verify, as ``bench/gdn_tree.py``'s ``ours_tf32``);
- ``ar``: fla-core's single-token decode step (``fused_recurrent_gated_delta_rule``, T = 1); the target is
  ``fused <= 2 ar``;
- ``floor``: the bytes one fused step must move (the state read and written once, q / k / v in, o / Delta out,
  the record's path rows) at the copy rate measured in the same run.

Checked in the same run, before timing: the fused step's outputs, Delta and the state it writes against float64
torch (the closed form from the exact commit of the previous step's recorded factors) on the first requests.

Run (GPU, sm_90): ``python bench/gdn_fused.py [--batches 64 32 1] [--out gdn_fused.json]``; needs fla-core 0.6
for ``ar`` (the table says so when it is missing).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gdn_tree as bench_gdn  # noqa: E402

from lumotree.optimized import gdn_tree as G  # noqa: E402
from lumotree.optimized import gdn_tree_fused as FV  # noqa: E402
from lumotree.optimized import gdn_tree_pending as PD  # noqa: E402
from lumotree.optimized import gdn_tree_ref as R  # noqa: E402

N = 64


def fused_fns(x):
    """``(step, verify, record, pool, pending, state)``: the fused step on a pool of its own with one commit
    recorded; ``state``: the recorded step's ``first`` factors, and the last verify's ``o`` and ``factors``."""
    meta = G.tree_meta(x["parents"])
    pool = x["pool"].clone()
    pending = PD.pending_commits(pool, x["k"].shape[2])
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    _, first = G.gdn_tree_verify(*args, pool, x["slots"], x["parents"], use_qk_l2norm_in_kernel=True,
                                 input_precision="tf32", meta=meta, validate=False)
    PD.gdn_tree_record(pending, pool, x["slots"], first, x["parents"], x["accepted"], meta=meta, validate=False)
    state = {"first": first}
    max_depth = max(max(bench_gdn.depths(row)) for row in x["rows"])  # the drafter's depth, known on the host

    def verify():
        state["o"], state["factors"] = FV.gdn_tree_verify_fused(*args, pool, x["slots"], x["parents"], pending,
                                                                use_qk_l2norm_in_kernel=True, meta=meta,
                                                                max_depth=max_depth, validate=False)

    def record():
        PD.gdn_tree_record(pending, pool, x["slots"], state["factors"], x["parents"], x["accepted"], meta=meta,
                           validate=False)

    def step():
        verify()
        record()

    return step, verify, record, pool, pending, state


def check_fused(x, sub: int = 4) -> dict[str, float]:
    """One fused verify from a recorded commit against float64 on the first ``sub`` requests."""
    _, verify, _, pool, _, state = fused_fns(x)
    start = x["pool"]
    s1 = R.gdn_tree_commit_ref(start.double(), x["slots"], state["first"], x["parents"], x["accepted"])
    verify()
    torch.cuda.synchronize()
    slots = x["slots"].long()
    pool64 = torch.zeros(pool.shape, dtype=torch.float64, device=pool.device)
    pool64[slots] = s1
    want_o, want_f = R.gdn_tree_closed_form_ref(*(x[n][:sub].double() for n in ("q", "k", "v", "g", "beta")), pool64,
                                                x["slots"][:sub], x["parents"][:sub], use_qk_l2norm=True)
    return dict(err_o=bench_gdn.rel_err(state["o"][:sub], want_o),
                err_delta=bench_gdn.rel_err(state["factors"].delta[:sub], want_f.delta),
                err_state=bench_gdn.rel_err(pool[slots], s1))


def step_bytes(B: int, path_nodes: float) -> float:
    """Bytes one fused step moves at least: the state read and written, q / k / v in, o / Delta out, and the
    record's (per request: the path's Delta rows read and written as ``dp``, its k rows read once per key head,
    the ``kpt`` tile written once per key head)."""
    state = 2 * 4 * B * bench_gdn.HV * bench_gdn.K * bench_gdn.V
    tokens = 4 * B * N * (2 * bench_gdn.H * bench_gdn.K + 3 * bench_gdn.HV * bench_gdn.V)
    record = 4 * B * (bench_gdn.H * bench_gdn.K * PD.PATH_NODES
                      + path_nodes * (2 * bench_gdn.HV * bench_gdn.V + bench_gdn.H * bench_gdn.K))
    return state + tokens + record


def run(B: int, copy: float) -> dict:
    x = bench_gdn.make_inputs(B, N, "random", 0)
    row = dict(B=B, N=N, max_depth=x["max_depth"])
    row.update(check_fused(x))
    step, verify, _, _, _, _ = fused_fns(x)
    row["fused_us"] = bench_gdn.graph_time(step)[0]
    row["fused_verify_us"] = bench_gdn.graph_time(verify)[0]
    row["record_in_step_us"] = row["fused_us"] - row["fused_verify_us"]
    both = bench_gdn.ours_fns(x, "tf32")[2]
    row["split_us"] = bench_gdn.graph_time(both)[0]
    depth = G.tree_meta(x["parents"]).depth
    row["path_nodes"] = float((depth[torch.arange(B, device=depth.device), x["accepted"].long()] + 1).float().mean())
    row["floor_us"] = step_bytes(B, row["path_nodes"]) / copy * 1e6
    try:
        import fla.ops.gated_delta_rule as fla  # noqa: PLC0415

        row["ar_us"] = bench_gdn.graph_time(bench_gdn.fla_fns(x, fla)[0])[0]
    except ImportError as exc:
        print(f"fla not importable ({exc}): no ar column", flush=True)
        row["ar_us"] = float("nan")
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", nargs="+", type=int, default=[64, 32, 8])
    parser.add_argument("--out", default="gdn_fused.json")
    args = parser.parse_args()
    if not FV.fused_verify_supported("cuda"):
        print("the fused verify needs an sm_90 GPU")
        return 1
    copy = bench_gdn.copy_bandwidth()
    rows = [run(B, copy) for B in args.batches]
    print(f"{torch.cuda.get_device_name()}, copy rate {copy / 1e12:.2f} TB/s; ratios to fla's decode step (ar)")
    print("| B | fused step µs | / ar | split µs | / ar | fused verify | record (step - verify) | floor µs | "
          "fused / floor | "
          "err o / Delta / state |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['B']} | {r['fused_us']:.1f} | {r['fused_us'] / r['ar_us']:.2f}x | {r['split_us']:.1f} | "
              f"{r['split_us'] / r['ar_us']:.2f}x | {r['fused_verify_us']:.1f} | {r['record_in_step_us']:.1f} | "
              f"{r['floor_us']:.1f} | {r['fused_us'] / r['floor_us']:.2f} | {r['err_o']:.1e} / "
              f"{r['err_delta']:.1e} / {r['err_state']:.1e} |")
    with open(args.out, "w") as fh:
        json.dump(dict(card=torch.cuda.get_device_name(), copy_tb_s=copy / 1e12, rows=rows), fh, indent=1)
    return 0 if all(r["err_o"] < 3e-3 and r["err_delta"] < 2e-3 and r["err_state"] < 5e-4 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
