"""Print a short summary of Nsight Compute CSV exports: selected metrics per kernel launch (``--page details``),
the warp-stall reasons from the sampling counters (``--page raw``), and the SASS lines with the most stall samples
(``--page source --print-source sass``).

A source export made with ``--print-source cuda,sass`` is summarised per kernel source line instead (the Python lines of
a Triton kernel). Run: ``python bench/ncu_summary.py details.csv raw.csv [src_*.csv ...]`` (any file may be missing
or empty).
"""

from __future__ import annotations

import csv
import io
import sys

DETAILS = ("Duration", "Registers Per Thread", "Theoretical Occupancy", "Achieved Occupancy", "Block Limit Registers",
           "Block Limit Shared Mem", "Dynamic Shared Memory Per Block", "Static Shared Memory Per Block",
           "Memory Throughput", "DRAM Throughput", "Compute (SM) Throughput", "L1/TEX Hit Rate", "L2 Hit Rate",
           "Warp Cycles Per Issued Instruction", "Issue Slots Busy", "Executed Ipc Active", "Grid Size", "Waves Per SM",
           "Local Memory Spilling Requests", "Mem Busy", "Max Bandwidth")


def _rows(path: str) -> list[list[str]]:
    try:
        text = open(path, errors="replace").read()
    except OSError:
        return []
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    return list(csv.reader(io.StringIO("\n".join(lines))))


def details(path: str) -> None:
    rows = _rows(path)
    if not rows:
        print(f"(no details in {path})")
        return
    head = rows[0]
    col = {name: i for i, name in enumerate(head)}
    per: dict[tuple, dict] = {}
    for r in rows[1:]:
        if len(r) <= col["Metric Value"]:
            continue
        key = (r[col["ID"]], r[col["Kernel Name"]][:40], r[col.get("Grid Size", 0)], r[col.get("Block Size", 0)])
        per.setdefault(key, {})[r[col["Metric Name"]]] = f"{r[col['Metric Value']]} {r[col['Metric Unit']]}".strip()
    for key, metrics in per.items():
        print(f"-- launch {key[0]} {key[1]} grid {key[2]} block {key[3]}")
        print("   " + "; ".join(f"{m}={metrics[m]}" for m in DETAILS if m in metrics))


def raw(path: str) -> None:
    rows = _rows(path)
    if len(rows) < 3:
        print(f"(no raw metrics in {path})")
        return
    head = rows[0]
    name_col = head.index("Kernel Name") if "Kernel Name" in head else 4
    for r in rows[2:]:
        stalls = {}
        for i, name in enumerate(head):
            if name.startswith("smsp__pcsamp_warps_issue_stalled_") and not name.endswith("_not_issued"):
                try:
                    stalls[name.removeprefix("smsp__pcsamp_warps_issue_stalled_")] = float(r[i].replace(",", ""))
                except (ValueError, IndexError):
                    pass
        total = sum(stalls.values()) or 1.0
        top = sorted(stalls.items(), key=lambda kv: -kv[1])[:8]
        print(f"-- stalls {r[name_col][:40]}: " + ", ".join(f"{k} {100 * v / total:.0f}%" for k, v in top))


def source(path: str, top: int = 25) -> None:
    rows = _rows(path)
    if len(rows) < 2:
        print(f"(no source view in {path})")
        return
    start = next((i for i, r in enumerate(rows) if "Address" in r and "Source" in r), 0)
    rows = rows[start:]
    head = rows[0]
    try:
        samp = next(i for i, h in enumerate(head) if h.startswith("Warp Stall Sampling (All"))
        src = next(i for i, h in enumerate(head) if h == "Source")
    except StopIteration:
        print(f"(unexpected columns in {path}: {head[:8]})")
        return
    body = [r for r in rows[1:] if len(r) == len(head)]

    def val(r):
        try:
            return float(r[samp].replace(",", ""))
        except ValueError:
            return 0.0

    total = sum(val(r) for r in body) or 1.0
    print(f"-- {path}: {len(body)} SASS lines, {total:.0f} samples; top {top}:")
    for r in sorted(body, key=val, reverse=True)[:top]:
        print(f"   {100 * val(r) / total:5.1f}%  {r[src][:110]}")


def source_lines(path: str, top: int = 30) -> None:
    """Stall samples per high-level source line of a ``--print-source cuda,sass`` export (the Python lines of a
    Triton kernel: one section per source file, each starting with a ``"File Path"`` row)."""
    totals, text, current, head = {}, {}, "?", None
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError:
        print(f"(no source view in {path})")
        return
    for row in csv.reader(ln for ln in lines if ln.startswith('"')):
        if row and row[0] == "File Path":
            current, head = row[1].rsplit("/", 1)[-1], None
        elif row and row[0] == "Line No":
            head = row
        elif head and len(row) > 4 and row[0].isdigit():
            try:
                samples = float(row[4].replace(",", "") or 0)
            except ValueError:
                continue
            key = (current, int(row[0]))
            totals[key] = totals.get(key, 0.0) + samples
            text[key] = row[1]
    total = sum(totals.values()) or 1.0
    print(f"-- {path}: {len(totals)} source lines, {total:.0f} samples; top {top}:")
    for key in sorted(totals, key=totals.get, reverse=True)[:top]:
        print(f"   {100 * totals[key] / total:5.1f}%  {key[0]}:{key[1]}  {text[key].strip()[:100]}")


def main(argv: list[str]) -> int:
    if len(argv) >= 1:
        details(argv[0])
    if len(argv) >= 2:
        raw(argv[1])
    for path in argv[2:]:
        with open(path, errors="replace") as f:
            by_line = '"File Path"' in f.read(4096)
        source_lines(path) if by_line else source(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
