"""What the hardware allows: each speed target of the GDN op against the least time any exact implementation needs.

A target is a ratio to a baseline measured in the same run (``ratio x baseline`` = the time it allows). Its bound is
``max(flops / peak_flops, bytes / bandwidth)`` from the work every exact implementation does
(:mod:`lumotree.optimized.model.floors`), at the H200 datasheet peaks (the most favourable rates) and at the rates
the baseline's run measured. A target whose allowance is below its bound at the datasheet peaks cannot be met by any
implementation on that card. No GPU needed: the baselines come from ``bench/baselines/gdn_tree.json``.

    python bench/roofline.py [--json roofline.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lumotree.optimized.model.floors import DATASHEET, bound_us, gdn_bytes, gdn_flops

BASELINES = Path(__file__).resolve().parent / "baselines"
H, HV, K, V = 16, 32, 128, 128
RATIO = {1: 3.0}  # the GDN step's targets: <= 3x fla's decode step at B = 1, <= 2x above
DEFAULT_RATIO = 2.0


def assess(row: dict, copy_bandwidth: float) -> dict:
    """The allowance, the bounds and the verdict of the deferred step of one ``gdn_tree.json`` row."""
    B, N = row["B"], row["N"]
    ratio = RATIO.get(B, DEFAULT_RATIO)
    allowed = ratio * row["ar_us"]
    flops, nbytes = gdn_flops(B, N, HV, K, V), gdn_bytes(B, N, H, HV, K, V)
    sheet = bound_us(flops, nbytes, DATASHEET, "tf32_flops")
    measured = bound_us(flops, nbytes, {**DATASHEET, "bandwidth": copy_bandwidth}, "tf32_flops")
    return dict(B=B, N=N, ratio=ratio, allowed_us=allowed, bound_datasheet_us=sheet, bound_measured_us=measured,
                ours_us=row["deferred_us"], feasible=sheet <= allowed, met=row["deferred_us"] <= allowed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, default=BASELINES / "gdn_tree.json")
    parser.add_argument("--json", type=Path, help="write the table as JSON here")
    args = parser.parse_args()
    run = json.loads(args.baseline.read_text())
    rows = [assess(r, run["copy_TBps"] * 1e12) for r in run["rows"]
            if "error" not in r and "ar_us" in r and r["kind"] == "random"]
    print(f"{run['card']}, {run['date']}: the GDN step (deferred) against <= ratio x fla's decode step")
    print("| B | N | allowed µs | bound (datasheet) | bound (measured) | ours | verdict |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        verdict = ("met" if r["met"] else "missed") + ("" if r["feasible"] else ", below the bound: infeasible")
        print(f"| {r['B']} | {r['N']} | {r['allowed_us']:.1f} | {r['bound_datasheet_us']:.1f} | "
              f"{r['bound_measured_us']:.1f} | {r['ours_us']:.1f} | {verdict} |")
    if args.json:
        args.json.write_text(json.dumps({"datasheet": DATASHEET, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
