"""The engine loop: one thread owns the :class:`~lumotree.optimized.engine.Engine` and drives ``Engine.step()``; HTTP
handlers hand it requests and read their token events from per-request asyncio queues.

- **Submitting** (:meth:`EngineLoop.submit`, any thread) appends a :class:`Ticket` to an inbox under a lock and wakes
  the thread; between two steps the thread moves the inbox into the engine (``Engine.submit``), so the engine is only
  ever touched by its own thread and a handler never waits for a step.
- **Admission**: a request is refused (:class:`QueueFull`, HTTP 503) when the requests not yet holding a slot (the
  inbox and the engine's queue) would exceed the free slots plus ``max_waiting``; while draining (shutdown) every new
  request is refused (:class:`ShuttingDown`).
- **Events**: a step's token events (:class:`~lumotree.optimized.engine.TokenEvent`) go to their tickets' queues
  with one ``call_soon_threadsafe`` per step (one wake-up of the event loop, whatever the batch). A ticket whose
  time limit passes ends with ``finish_reason`` ``"timeout"``; an engine failure puts an :class:`EngineFailure` in
  the queue of every request it hit.
- **Cancelling** (:meth:`EngineLoop.cancel`: a client gone, a stop string found, a handler cancelled) marks the ticket;
  the thread calls ``Engine.abort`` before the next step, so the slot is free for that step's admissions and is never
  released while a step runs.
- **Stopping** (:meth:`EngineLoop.stop`) aborts what is left between two steps and joins the thread.

The loop consumes the engine's step records (``engine.stats.steps``) and finished requests as it goes (they feed
:class:`~lumotree.server.metrics.ServerMetrics`), so a long-running server keeps no per-step history.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from lumotree.optimized.engine import SamplingParams, TokenEvent

from .metrics import ServerMetrics

__all__ = ["EngineLoop", "Ticket", "QueueFull", "ShuttingDown", "EngineFailure"]

log = logging.getLogger("lumotree.server")


class QueueFull(Exception):
    """Every slot is taken and the waiting queue is at its bound (HTTP 503 with ``Retry-After``)."""


class ShuttingDown(Exception):
    """The server is draining for shutdown and takes no new request (HTTP 503)."""


@dataclass
class EngineFailure:
    """What a request's queue receives when the engine failed while running it (HTTP 500, or an error event)."""

    message: str


@dataclass(eq=False)
class Ticket:
    """One request in the loop: its prompt and sampling, its time limit, and the asyncio queue its events go to."""

    prompt: list[int]
    params: SamplingParams
    timeout: float | None
    events: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    arrival: float = field(default_factory=time.perf_counter)
    request_id: int | None = None  # the engine's id, once submitted
    emitted: int = 0  # tokens emitted so far
    first_token_at: float | None = None
    done: bool = False

    def deliver(self, item: TokenEvent | EngineFailure) -> None:
        """Put ``item`` in the queue from the engine thread (dropped when the handler's event loop is closed)."""
        _deliver_all(self.loop, [(self, item)])


def _put_all(items: list[tuple[Ticket, Any]]) -> None:
    for ticket, item in items:
        ticket.events.put_nowait(item)


def _deliver_all(loop: asyncio.AbstractEventLoop, items: list[tuple[Ticket, Any]]) -> None:
    """Hand ``items`` to their queues on ``loop`` with one wake-up (one per step, not one per request)."""
    try:
        loop.call_soon_threadsafe(_put_all, items)
    except RuntimeError:  # the event loop is closed: nobody reads these queues any more
        pass


class EngineLoop:
    """The thread that owns ``engine`` (module docstring)."""

    def __init__(self, engine: Any, max_waiting: int, metrics: ServerMetrics):
        self.engine = engine
        self.max_waiting = int(max_waiting)
        self.metrics = metrics
        self._cond = threading.Condition()
        self._inbox: list[Ticket] = []
        self._cancelled: list[tuple[Ticket, str]] = []
        self._live: dict[int, Ticket] = {}  # engine id -> ticket, engine thread only
        self._draining = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        metrics.track(running=lambda: len(engine.running),
                      waiting=lambda: len(self._inbox) + len(engine.waiting))
        if getattr(engine, "prefix_cache", None) is not None:
            metrics.track_prefix_cache(engine.prefix_cache)

    # ------------------------------------------------------------------------------------------------ handler side
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="lumotree-engine", daemon=True)
        self._thread.start()

    def submit(self, prompt: list[int], params: SamplingParams, timeout: float | None) -> Ticket:
        """Queue a request from a running asyncio loop; raises :class:`QueueFull` or :class:`ShuttingDown`."""
        ticket = Ticket(prompt, params, timeout, asyncio.Queue(), asyncio.get_running_loop())
        with self._cond:
            if self._draining or self._stopping:
                raise ShuttingDown("the server is shutting down")
            waiting = len(self._inbox) + len(self.engine.waiting)
            room = len(self.engine.free_slots) + self.max_waiting
            if waiting >= room:
                self.metrics.rejected.inc()
                raise QueueFull(f"the server is at capacity: every slot is taken and {waiting} request(s) wait "
                                f"(--max-waiting {self.max_waiting})")
            self._inbox.append(ticket)
            self._cond.notify()
        return ticket

    def cancel(self, ticket: Ticket, reason: str = "abort") -> None:
        """End ``ticket`` before the next step (no-op once it is done); ``reason`` is its finish reason in the
        metrics (``"stop"`` when the handler found a stop string)."""
        with self._cond:
            if not ticket.done:
                self._cancelled.append((ticket, reason))
                self._cond.notify()

    def drain(self) -> None:
        """Refuse new requests from now on; the ones already in keep running."""
        with self._cond:
            self._draining = True

    def stop(self, timeout: float = 10.0) -> None:
        """Abort every request left (between two steps) and join the thread."""
        with self._cond:
            self._draining = self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def counts(self) -> dict[str, int]:
        """Requests running (holding a slot) and waiting for one."""
        return {"running": len(self.engine.running), "waiting": len(self._inbox) + len(self.engine.waiting)}

    # ------------------------------------------------------------------------------------------------ engine thread
    def _run(self) -> None:
        engine = self.engine
        while True:
            with self._cond:
                while not (self._inbox or self._cancelled or self._stopping or engine.has_work()):
                    self._cond.wait()
                inbox, self._inbox = self._inbox, []
                cancelled, self._cancelled = self._cancelled, []
                stopping = self._stopping
            for ticket in inbox:
                self._enter(ticket)
            for ticket, reason in cancelled:
                self._end(ticket, reason, notify=False)
            now = time.perf_counter()
            for ticket in [t for t in self._live.values() if t.timeout is not None and now - t.arrival > t.timeout]:
                self._end(ticket, "timeout", notify=True)
            if stopping:
                for ticket in list(self._live.values()):
                    self._end(ticket, "abort", notify=True)
                return
            if engine.has_work():
                self._step()

    def _enter(self, ticket: Ticket) -> None:
        try:
            ticket.request_id = self.engine.submit(ticket.prompt, ticket.params)
        except ValueError as exc:  # the handler checks requests first: this is a bug, not the client's input
            ticket.done = True
            ticket.deliver(EngineFailure(f"the engine refused the request: {exc}"))
            return
        self._live[ticket.request_id] = ticket
        self.metrics.prompt_tokens.inc(len(ticket.prompt))

    def _end(self, ticket: Ticket, reason: str, notify: bool) -> None:
        """Abort ``ticket`` in the engine and close it; ``notify`` puts a final event in its queue."""
        if ticket.done or ticket.request_id is None:
            return
        self.engine.abort(ticket.request_id)
        self._close(ticket, TokenEvent(ticket.request_id, [], True, reason) if notify else None, reason)

    def _close(self, ticket: Ticket, event: TokenEvent | None, reason: str) -> None:
        ticket.done = True
        self._live.pop(ticket.request_id, None)
        self.engine.finished.pop(ticket.request_id, None)
        self.metrics.finish(ticket, reason, time.perf_counter())
        if event is not None:
            ticket.deliver(event)

    def _step(self) -> None:
        start = time.perf_counter()
        try:
            events = self.engine.step()
        except Exception as exc:  # noqa: BLE001 - fail the requests, keep serving
            log.error("engine step failed:\n%s", traceback.format_exc())
            self._fail_all(f"the engine failed: {type(exc).__name__}: {exc}")
            return
        now = time.perf_counter()
        records = list(self.engine.stats.steps)
        self.engine.stats.steps.clear()  # consumed here: a long-running server keeps no per-step history
        self.metrics.record_steps(records, now)
        deliveries: dict[asyncio.AbstractEventLoop, list[tuple[Ticket, Any]]] = {}
        for event in events:
            ticket = self._live.get(event.request_id)
            if ticket is None:
                continue
            if ticket.first_token_at is None and event.tokens:
                ticket.first_token_at = now
                self.metrics.first_token(ticket, start, now)
            ticket.emitted += len(event.tokens)
            if event.finished:
                self._close(ticket, None, event.finish_reason)
            deliveries.setdefault(ticket.loop, []).append((ticket, event))
        for loop, items in deliveries.items():
            _deliver_all(loop, items)

    def _fail_all(self, message: str) -> None:
        """After a failed step: every live request ends with an error and leaves the engine."""
        for ticket in list(self._live.values()):
            try:
                self.engine.abort(ticket.request_id)
            except Exception:  # noqa: BLE001 - the engine is already in trouble; the request ends either way
                log.error("abort after a failed step failed:\n%s", traceback.format_exc())
            ticket.done = True
            self._live.pop(ticket.request_id, None)
            self.engine.finished.pop(ticket.request_id, None)
            self.metrics.finish(ticket, "error", time.perf_counter())
            ticket.deliver(EngineFailure(message))
