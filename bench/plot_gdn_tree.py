"""Plot the GDN tree benchmark for docs/gdn-kernels.md (bench/results/2026-11-29-h200-gdn-tree-run3.json and, for the
launch-config sweep, bench/results/2026-11-29-h200-gdn-tree.json).

Left: one layer at B=64, N=64 (random tree, depth 10), run 3: our verify + commit in the three precision modes
against the memory floors and fla's single-token decode step measured in the same run; branch-by-branch and per-node
states from the anchors (DESIGN.md §7, same card type, not this run: fla's varlen kernel faults in fla-core 0.6.0 and
the per-node baseline did not fit the run's time budget).
Right: verify time of each launch configuration of the run-2 sweep (tf32), per (B, N).

Run: ``python bench/plot_gdn_tree.py`` (writes docs/img/gdn-tree-h200.png).
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ANCHOR = {"branch-by-branch (fla)": 6486.9, "per-node states": 26768.8}


def main() -> int:
    runs = json.loads((ROOT / "bench/results/2026-11-29-h200-gdn-tree.json").read_text())["runs"]
    run2 = runs[1]
    run3 = json.loads((ROOT / "bench/results/2026-11-29-h200-gdn-tree-run3.json").read_text())
    row3 = next(r for r in run3["rows"] if (r["B"], r["N"], r["kind"]) == (64, 64, "random"))
    bars = [
        ("state floor\n(read S0, write S)", row3["floor_us"], "0.6"),
        ("io floor\n(+ tokens, factors)", row3["io_floor_us"], "0.6"),
        ("ours tf32", row3["ours_tf32_us"], "C0"),
        ("ours tf32x3", row3["ours_tf32x3_us"], "C0"),
        ("ours ieee", row3["ours_ieee_us"], "C0"),
        ("fla decode step\n(same run)", row3["ar_us"], "C1"),
        ("branch-by-branch\n(anchor)", ANCHOR["branch-by-branch (fla)"], "C3"),
        ("per-node states\n(anchor)", ANCHOR["per-node states"], "C3"),
    ]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(14, 5.2), gridspec_kw=dict(width_ratios=[1.25, 1]))
    ax.bar(range(len(bars)), [b[1] for b in bars], color=[b[2] for b in bars])
    ax.set_yscale("log")
    ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=7.5, rotation=30, ha="right")
    for i, (_, us, _) in enumerate(bars):
        ax.text(i, us * 1.08, f"{us:.0f}", ha="center", fontsize=8)
    ax.axhline(2 * row3["ar_us"], color="C1", ls="--", lw=1)
    ax.text(len(bars) - 0.5, 2 * row3["ar_us"] * 1.08, "target: 2x decode", color="C1", ha="right",
            fontsize=8)
    ax.set_ylabel("us per layer (CUDA graph, median)")
    ax.set_title("B=64, N=64 random tree: verify + commit, one GDN layer (H200, run 3)", fontsize=10)

    sweep = [s for s in run2["sweep"] if "verify_us" in s and s["mode"] == "tf32"]
    shapes = sorted({(s["B"], s["N"]) for s in sweep})
    for j, (B, N) in enumerate(shapes):
        pts = [s for s in sweep if (s["B"], s["N"]) == (B, N)]
        xs = [j + (i - len(pts) / 2) * 0.09 for i in range(len(pts))]
        bx.scatter(xs, [p["verify_us"] for p in pts], c=["C0" if p["config"][4] else "C2" for p in pts], s=18)
    bx.set_yscale("log")
    bx.set_xticks(range(len(shapes)), [f"B={B}\nN={N}" for B, N in shapes])
    bx.set_ylabel("verify us (tf32)")
    bx.set_title("launch-config sweep: blue split (solve + apply), green fused", fontsize=10)
    fig.tight_layout()
    out = ROOT / "docs/img/gdn-tree-h200.png"
    fig.savefig(out, dpi=130)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
