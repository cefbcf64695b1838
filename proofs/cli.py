"""``lumotree prove``: run the registered checks with a progress display and print a table of results.

Exit status 0 iff every check came out as expected (``proved``, ``checked`` where stated, ``refuted`` for the
deliberately lossy verification variant).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from .core import CheckResult, CheckSpec, run_checks, select_checks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="CI-sized scope (a few minutes on 2 cores)")
    parser.add_argument("--only", metavar="NAME", help="run one check (or a family: 'closed-form' runs closed-form/*)")
    parser.add_argument("--json", metavar="PATH", type=Path, help="write the results as JSON")
    parser.add_argument(
        "--markdown", metavar="PATH", type=Path, help="write the results as a Markdown page (docs/proof-results.md)"
    )
    parser.add_argument("--list", action="store_true", help="list the checks and what each claims, then exit")
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="worker processes, one check each (default: the available cores, at most 4)",
    )


class Progress:
    """Progress on stderr: one status line rewritten in place on a terminal, a line per event otherwise."""

    def __init__(self, stream: TextIO, total: int):
        self.stream = stream
        self.tty = stream.isatty()
        self.total = total
        self.finished = 0
        self.label = ""
        self.last = 0.0

    def start(self, index: int, total: int, spec: CheckSpec) -> None:
        self.label = spec.name
        self._write(f"[{self.finished}/{self.total} done] {spec.name} ...", final=not self.tty)

    def step(self, done: int, total: int, note: str) -> None:
        now = time.monotonic()
        if self.tty and (now - self.last > 0.1 or done == total):
            self.last = now
            self._write(f"[{self.finished}/{self.total} done] {self.label}  {done}/{total} {note}", final=False)

    def result(self, result: CheckResult) -> None:
        self.finished += 1
        mark = "ok" if result.ok else f"UNEXPECTED (expected {result.expected})"
        self._write(
            f"[{self.finished}/{self.total} done] {result.name}  {result.status} in {result.seconds:.1f} s  {mark}",
            final=True,
        )

    def _write(self, text: str, final: bool) -> None:
        if self.tty:
            self.stream.write("\r\033[K" + text + ("\n" if final else ""))
        elif final:
            self.stream.write(text + "\n")
        self.stream.flush()


def format_table(results: list[CheckResult]) -> str:
    """A plain-text table: check, status, expected, seconds, scope (trees), detail."""
    rows = [("check", "status", "ok", "seconds", "trees", "detail")]
    for r in results:
        rows.append(
            (
                r.name,
                r.status,
                "yes" if r.ok else f"NO (expected {r.expected})",
                f"{r.seconds:.1f}",
                r.scope.get("trees", "-"),
                r.detail,
            )
        )
    widths = [min(max(len(row[c]) for row in rows), 60) for c in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        cells = [cell if len(cell) <= widths[c] else cell[: widths[c] - 1] + "…" for c, cell in enumerate(row)]
        lines.append("  ".join(cell.ljust(widths[c]) for c, cell in enumerate(cells)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _environment() -> dict[str, Any]:
    import sympy
    import z3

    return {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "sympy": sympy.__version__,
        "z3": z3.get_version_string(),
        "machine": f"{platform.machine()}, {_cpu_count()} cores",
    }


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def format_markdown(
    results: list[CheckResult], quick: bool, total_seconds: float, jobs: int, env: dict[str, Any]
) -> str:
    """The results page: a summary table, then each check's claim, scope and result (counterexample if any)."""
    lines = [
        "# Proof results",
        "",
        f"Written by `lumotree prove{' --quick' if quick else ''} --markdown docs/proof-results.md` on {env['date']}: "
        f"{len(results)} checks in {total_seconds:.0f} s wall with {jobs} worker process{'es' if jobs > 1 else ''} "
        f"({env['machine']}; Python {env['python']}, sympy "
        f"{env['sympy']}, Z3 {env['z3']}). Statuses: `proved` (symbolic identity or unsat negation over the whole "
        "scope, or an exhaustive exact enumeration), `checked` (exact agreement on random samples), `refuted` "
        "(with a counterexample), `unknown`.",
        "",
        "| check | status | expected | seconds |",
        "|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| [`{r.name}`](#{_anchor(r.name)}) | {r.status} | {r.expected} | {r.seconds:.1f} |")
    for r in results:
        lines += ["", f"## {r.name}", "", f"**Claim.** {r.claim}", "", f"**Result.** {r.status} — {r.detail}", ""]
        for key, value in r.scope.items():
            lines.append(f"- {key}: {value}")
        if r.counterexample is not None:
            lines += ["", "Counterexample:", "", "```json", json.dumps(r.counterexample, indent=1)[:4000], "```"]
    return "\n".join(lines) + "\n"


def _anchor(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum() or ch in "-_ ").replace(" ", "-")


def run(args: argparse.Namespace) -> int:
    if args.list:
        for spec in select_checks(args.only):
            print(f"{spec.name:28s} expect {spec.expected:8s} {spec.claim}")
        return 0
    try:
        specs = select_checks(args.only)
    except ValueError as err:
        print(f"lumotree prove: {err}", file=sys.stderr)
        return 2
    jobs = args.jobs if args.jobs is not None else min(_cpu_count(), 4)
    if jobs < 1:
        print(f"lumotree prove: --jobs {jobs} must be at least 1", file=sys.stderr)
        return 2
    progress = Progress(sys.stderr, len(specs))
    start = time.perf_counter()
    results = run_checks(
        args.only,
        quick=args.quick,
        jobs=jobs,
        on_start=progress.start,
        on_progress=progress.step,
        on_result=progress.result,
    )
    total = time.perf_counter() - start
    print(format_table(results))
    bad = [r for r in results if not r.ok]
    print(
        f"\n{len(results) - len(bad)}/{len(results)} checks as expected in {total:.1f} s"
        f" ({'quick' if args.quick else 'full'} scope, {jobs} worker{'s' if jobs > 1 else ''})"
    )
    for r in bad:
        print(f"\n{r.name}: {r.status} (expected {r.expected}): {r.detail}")
        if r.counterexample is not None:
            print(json.dumps(r.counterexample, indent=1)[:3000])
    env = _environment()
    if args.json:
        payload = {
            "scope": "quick" if args.quick else "full",
            "seconds": round(total, 3),
            "jobs": jobs,
            "environment": env,
            "results": [r.to_json() for r in results],
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=1) + "\n")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(format_markdown(results, args.quick, total, jobs, env))
    return 0 if not bad else 1
