"""``lumotree serve --tensor-parallel N``: rank 0 serves HTTP and drives its engine; the other ranks replay what it
does to theirs, so that every rank makes the same steps (and the same collective calls).

- :class:`LeaderEngine` (rank 0) wraps the engine: ``submit`` and ``abort`` run and are recorded; ``step`` first
  broadcasts the calls recorded since the last step with the step itself (one broadcast a step, on the host),
  ``close`` tells the followers to stop. Everything else reads through to the engine.
- :func:`follow` (ranks 1 ..) applies each broadcast list in order until ``close``.

A request's seed, when it gives none, is drawn from the engine's seeded generator at ``submit``: the same calls in
the same order give every rank the same seeds.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["LeaderEngine", "follow"]

log = logging.getLogger("lumotree.server")


class LeaderEngine:
    """Rank 0's engine, its calls recorded for the followers (module docstring)."""

    def __init__(self, engine: Any):
        self._engine = engine
        self._calls: list[tuple] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def submit(self, prompt: Any, params: Any = None) -> int:
        request_id = self._engine.submit(prompt, params)  # refused (ValueError): not recorded
        self._calls.append(("submit", list(prompt), params))
        return request_id

    def abort(self, request_id: int) -> bool:
        self._calls.append(("abort", int(request_id)))
        return self._engine.abort(request_id)

    def step(self) -> list:
        calls, self._calls = self._calls + [("step",)], []
        self._engine.parallel.broadcast_object(calls)
        return self._engine.step()

    def close(self) -> None:
        """The followers stop (after the calls recorded so far)."""
        calls, self._calls = self._calls + [("close",)], []
        self._engine.parallel.broadcast_object(calls)


def follow(engine: Any) -> int:
    """Replay rank 0's calls on this rank's ``engine`` until it closes; returns the steps run."""
    steps = 0
    while True:
        for call in engine.parallel.broadcast_object(None):
            if call[0] == "submit":
                engine.submit(call[1], call[2])
            elif call[0] == "abort":
                engine.abort(call[1])
            elif call[0] == "step":
                engine.step()
                steps += 1
                engine.stats.steps.clear()  # no per-step history (as rank 0's loop)
                for request_id in [i for i, r in engine.finished.items() if r.finished]:
                    engine.finished.pop(request_id)
            else:
                return steps
