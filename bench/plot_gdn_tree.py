"""Plot the GDN tree benchmark (bench/results/2026-11-29-h200-gdn-tree.json) for docs/gdn-kernels.md.

Left: one layer at B=64, N=64 (random tree, depth 10): our verify + commit in the three precision modes against the
memory floors of the same run and fla / baselines from the anchors (DESIGN.md §7, same card type, not this run).
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
ANCHOR = {"fla decode step": 112.1, "branch-by-branch (fla)": 6486.9, "per-node states": 26768.8}


def main() -> int:
    runs = json.loads((ROOT / "bench/results/2026-11-29-h200-gdn-tree.json").read_text())["runs"]
    run1, run2 = runs
    row1, row2 = run1["rows"][0], run2["rows"][0]
    bars = [
        ("state floor\n(read S0, write S)", row2["floor_us"], "0.6"),
        ("io floor\n(+ tokens, factors)", row2["io_floor_us"], "0.6"),
        ("ours tf32", row2["ours_tf32_us"], "C0"),
        ("ours tf32\n(run 1, truncated)", row1["ours_tf32_us"], "C9"),
        ("ours tf32x3", row2["ours_tf32x3_us"], "C0"),
        ("ours ieee", row2["ours_ieee_us"], "C0"),
        ("fla decode step\n(anchor)", ANCHOR["fla decode step"], "C1"),
        ("branch-by-branch\n(anchor)", ANCHOR["branch-by-branch (fla)"], "C3"),
        ("per-node states\n(anchor)", ANCHOR["per-node states"], "C3"),
    ]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(14, 5.2), gridspec_kw=dict(width_ratios=[1.25, 1]))
    ax.bar(range(len(bars)), [b[1] for b in bars], color=[b[2] for b in bars])
    ax.set_yscale("log")
    ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=7.5, rotation=30, ha="right")
    for i, (_, us, _) in enumerate(bars):
        ax.text(i, us * 1.08, f"{us:.0f}", ha="center", fontsize=8)
    ax.axhline(2 * ANCHOR["fla decode step"], color="C1", ls="--", lw=1)
    ax.text(len(bars) - 0.5, 2 * ANCHOR["fla decode step"] * 1.08, "target: 2x decode", color="C1", ha="right",
            fontsize=8)
    ax.set_ylabel("us per layer (CUDA graph, median)")
    ax.set_title("B=64, N=64 random tree: verify + commit, one GDN layer (H200)", fontsize=10)

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
