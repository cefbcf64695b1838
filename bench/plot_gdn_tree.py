"""Plot the GDN tree benchmark for docs/gdn-kernels.md.

Left: one layer at B=64, N=64 (random tree, depth 10), from bench/results/2026-12-03/gdn_tree_run38.json (the
twenty-first session's run with the tensor-descriptor defaults, H200; fla's decode step and branch by branch called
correctly since 2026-12-02b run 7,
both checked against float64): our verify + commit in tf32, tf32x3 and ieee against the memory floors, fla's
single-token decode step, branch by branch and per-node states of the same run, and our 2026-11-29 run.
Right: verify + commit over fla's decode step of the same run for every (B, N), random trees and chains, tf32
(bench/results/2026-12-03c/gdn_tree_run57.json, the twenty-fifth session's full grid; its N = 128 rows from
bench/results/2026-12-03d/gdn_tree_run63.json, the twenty-sixth session's solve by row halves), with the two targets.

Run: ``python bench/plot_gdn_tree.py`` (writes docs/img/gdn-tree-h200.png).
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    results = ROOT / "bench/results"
    load = lambda name: json.loads((results / name).read_text())  # noqa: E731
    pick = lambda run: next(r for r in run["rows"] if (r["B"], r["N"], r["kind"]) == (64, 64, "random"))  # noqa: E731
    row = pick(load("2026-12-03/gdn_tree_run38.json"))
    row_old = pick(load("2026-11-29-h200-gdn-tree-run3.json"))
    bars = [
        ("state floor\n(read S0, write S)", row["floor_us"], "0.6"),
        ("io floor\n(+ tokens, factors)", row["io_floor_us"], "0.6"),
        ("ours tf32\n(2026-12-03)", row["ours_tf32_us"], "C0"),
        ("ours tf32\n(2026-11-29)", row_old["ours_tf32_us"], "C9"),
        ("ours tf32x3\n(2026-12-03)", row["ours_tf32x3_us"], "C0"),
        ("ours ieee\n(2026-12-03)", row["ours_ieee_us"], "C0"),
        ("fla decode step\n(same run)", row["ar_us"], "C1"),
        ("branch-by-branch\n(fla, same run)", row["branch_us"], "C3"),
        ("per-node states\n(same run)", row["pernode_us"], "C3"),
    ]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(14, 5.2), gridspec_kw=dict(width_ratios=[1.25, 1]))
    ax.bar(range(len(bars)), [b[1] for b in bars], color=[b[2] for b in bars])
    ax.set_yscale("log")
    ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=7.5, rotation=30, ha="right")
    for i, (_, us, _) in enumerate(bars):
        ax.text(i, us * 1.08, f"{us:.0f}", ha="center", fontsize=8)
    ax.axhline(2 * row["ar_us"], color="C1", ls="--", lw=1)
    ax.text(len(bars) - 0.5, 2 * row["ar_us"] * 1.08, "target: 2x decode", color="C1", ha="right", fontsize=8)
    ax.set_ylabel("us per layer (CUDA graph, median)")
    ax.set_title("B=64, N=64 random tree: verify + commit, one GDN layer (H200)", fontsize=10)

    # every (B, N), random trees and chains; N = 128 from run 63 (the solve by row halves), each over its own run's
    # decode step
    grid = [r for r in load("2026-12-03c/gdn_tree_run57.json")["rows"] if r["N"] != 128]
    grid += [r for r in load("2026-12-03d/gdn_tree_run63.json")["rows"] if r["N"] == 128]
    shapes = sorted({(r["B"], r["N"]) for r in grid})
    for dx, kind, color in ((-0.2, "random", "C0"), (0.2, "chain", "C2")):
        for j, (B, N) in enumerate(shapes):
            r = next(r for r in grid if (r["B"], r["N"], r["kind"]) == (B, N, kind))
            ratio = r["ours_tf32_us"] / r["ar_us"]
            label = ("random trees" if kind == "random" else "chains") if j == 0 else None
            bx.bar(j + dx, ratio, width=0.38, color=color, label=label)
            bx.text(j + dx, ratio + 0.15, f"{ratio:.1f}", ha="center", fontsize=6.5)
    for B, N, target in ((64, 64, 2.0), (1, 64, 3.0)):
        j = shapes.index((B, N))
        bx.plot([j - 0.45, j + 0.45], [target, target], color="C1", lw=2,
                label="targets: 2x at B=64, 3x at B=1 (N=64)" if B == 64 else None)
    bx.set_xticks(range(len(shapes)), [f"B={B}\nN={N}" for B, N in shapes], fontsize=7.5)
    bx.set_ylabel("verify + commit / fla decode step (same run)")
    bx.set_title("every (B, N), tf32, fp32 inputs (2026-12-03, run 57; N=128 run 63)", fontsize=10)
    bx.set_ylim(0, 1.2 * bx.get_ylim()[1])
    bx.legend(fontsize=7.5, loc="upper left", ncol=3)
    fig.tight_layout()
    out = ROOT / "docs/img/gdn-tree-h200.png"
    fig.savefig(out, dpi=130)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
