"""Warm-up tasks in parallel worker processes: the benchmarks compile their Triton variants this way before timing.

``run_tasks(fn, tasks, timeout_s)`` calls ``fn(task)`` for every task in a pool of spawned processes (one per CPU
core but one), waits at most ``timeout_s`` in all and returns ``(seconds, results)`` with one entry per task: what
``fn`` returned, or ``"not finished: ..."``. The compiled kernels land in the shared Triton cache
(``TRITON_CACHE_DIR``), so the main process loads them instead of compiling; whatever did not finish it compiles
itself. ``fn`` must be importable by the workers (a module-level function of the calling script); ``warm_calls`` is the
body such a function usually has.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from typing import Any, Callable, Iterator


def run_tasks(fn: Callable[[Any], str], tasks: list, timeout_s: float) -> tuple[float, list[str]]:
    """``fn(task)`` for every task in spawned worker processes, at most ``timeout_s`` seconds in all."""
    t0 = time.time()
    pool = mp.get_context("spawn").Pool(processes=max(1, min(len(tasks), (os.cpu_count() or 2) - 1)))
    pending = [pool.apply_async(fn, (task,)) for task in tasks]
    results = []
    for p in pending:
        try:
            results.append(p.get(timeout=max(0.1, timeout_s - (time.time() - t0))))
        except Exception as e:  # a timeout: the main process compiles what is missing
            results.append("not finished: " + repr(e)[:80])
    pool.terminate()
    pool.join()
    return time.time() - t0, results


def warm_calls(calls: Iterator[tuple[str, Callable[[], object]]]) -> str:
    """Run every ``(label, call)`` that ``calls`` yields (a generator that builds its inputs first) and synchronise
    the GPU: ``"ok"``, or the error that stopped the setup. A failing call is printed and skipped: the main process
    records it when it runs the same call."""
    import torch

    try:
        for label, call in calls:
            try:
                call()
            except Exception as e:
                print(f"warm {label}: {repr(e)[:120]}", flush=True)
        torch.cuda.synchronize()
        return "ok"
    except Exception as e:
        return repr(e)[:200]
