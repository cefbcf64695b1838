"""The server's Prometheus metrics (``GET /metrics``), one registry per server.

Per request: time to first token (arrival to the end of the step that emitted it), time per output token after the
first, queue time (arrival to the start of the step that prefilled it), end-to-end latency of completed requests,
requests by finish reason, requests refused at admission. Per step: seconds by kind (``prefill``, ``autoregressive``,
``verify``) and the accepted draft tokens per request of each speculative step. Totals of prompt and generated
tokens, generated tokens per second over the last ``RATE_WINDOW_S`` seconds, and requests running and waiting.
With a prefix cache: its lookups and hits (requests and prompt tokens; hit tokens / query tokens is the share of
prompt tokens not prefilled), snapshots evicted, and its bytes held against its budget.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

__all__ = ["ServerMetrics", "RATE_WINDOW_S", "COMPLETED"]

#: seconds over which the tokens/s gauge averages
RATE_WINDOW_S = 10.0
#: the engine's finish reasons of a request that ran to its end
COMPLETED = ("stop", "length", "max_new_tokens")
_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_PER_TOKEN = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
_ACCEPTED = (0, 0.5, 1, 1.5, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128)


class ServerMetrics:
    """The metrics of one server, fed by its engine loop; :meth:`render` is the ``/metrics`` body."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram("lumotree_time_to_first_token_seconds", "arrival to the first generated token",
                              buckets=_LATENCY, registry=r)
        self.tpot = Histogram("lumotree_time_per_output_token_seconds",
                              "seconds per generated token after the first, per request", buckets=_PER_TOKEN,
                              registry=r)
        self.queue_time = Histogram("lumotree_queue_time_seconds", "arrival to the step that prefills the request",
                                    buckets=_LATENCY, registry=r)
        self.latency = Histogram("lumotree_request_latency_seconds", "arrival to the last token, completed requests",
                                 buckets=_LATENCY, registry=r)
        self.step_seconds = Histogram("lumotree_step_seconds", "engine step seconds by kind", ["kind"],
                                      buckets=_PER_TOKEN + (5.0, 10.0), registry=r)
        self.accepted = Histogram("lumotree_accepted_tokens_per_step",
                                  "accepted draft tokens per request of each speculative step", buckets=_ACCEPTED,
                                  registry=r)
        self.prompt_tokens = Counter("lumotree_prompt_tokens", "prompt tokens of the requests taken", registry=r)
        self.generation_tokens = Counter("lumotree_generation_tokens", "tokens generated", registry=r)
        self.finished = Counter("lumotree_requests_finished", "requests ended, by engine finish reason "
                                "(stop, length, max_new_tokens, abort, timeout, error)", ["finish_reason"], registry=r)
        self.rejected = Counter("lumotree_requests_rejected", "requests refused at admission (HTTP 503)", registry=r)
        self.tokens_per_s = Gauge("lumotree_generation_tokens_per_second",
                                  f"tokens generated per second over the last {RATE_WINDOW_S:g} s", registry=r)
        self.running = Gauge("lumotree_requests_running", "requests holding a slot", registry=r)
        self.waiting = Gauge("lumotree_requests_waiting", "requests waiting for a slot", registry=r)
        self._recent: deque[tuple[float, int]] = deque()  # (step end, tokens)
        self._lock = threading.Lock()
        self.tokens_per_s.set_function(self._rate)

    def track(self, running: Callable[[], int], waiting: Callable[[], int]) -> None:
        """Read the running and waiting gauges from these functions at each scrape."""
        self.running.set_function(running)
        self.waiting.set_function(waiting)

    def track_prefix_cache(self, cache: Any) -> None:
        """Report ``cache`` (a :class:`~lumotree.optimized.engine.PrefixCache`) at each scrape."""
        self.registry.register(_PrefixCacheCollector(cache))

    def record_steps(self, records: Iterable[Any], now: float) -> None:
        """The engine's step records (:class:`~lumotree.optimized.engine.StepRecord`) of the last step."""
        tokens = 0
        for record in records:
            self.step_seconds.labels(record.kind).observe(record.total_s)
            if record.kind == "verify" and record.batch:
                self.accepted.observe(record.accepted / record.batch)
            tokens += record.emitted
        self.generation_tokens.inc(tokens)
        with self._lock:
            self._recent.append((now, tokens))
            while self._recent and self._recent[0][0] < now - RATE_WINDOW_S:
                self._recent.popleft()

    def first_token(self, ticket: Any, step_start: float, now: float) -> None:
        self.ttft.observe(now - ticket.arrival)
        self.queue_time.observe(max(step_start - ticket.arrival, 0.0))

    def finish(self, ticket: Any, reason: str, now: float) -> None:
        self.finished.labels(reason).inc()
        if ticket.first_token_at is not None and ticket.emitted > 1:
            self.tpot.observe((now - ticket.first_token_at) / (ticket.emitted - 1))
        if reason in COMPLETED:
            self.latency.observe(now - ticket.arrival)

    def _rate(self) -> float:
        now = time.perf_counter()
        with self._lock:
            tokens = sum(n for t, n in self._recent if t >= now - RATE_WINDOW_S)
        return tokens / RATE_WINDOW_S

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _PrefixCacheCollector:
    """The prefix cache's counts, read from its statistics at each scrape."""

    COUNTERS = (("queries", "prompts looked up in the prefix cache"),
                ("hits", "prompts that restored a cached prefix"),
                ("query_tokens", "prompt tokens looked up (all but each prompt's last)"),
                ("hit_tokens", "prompt tokens restored from the prefix cache instead of prefilled"),
                ("evicted", "prefix-cache snapshots evicted under the budget"))

    def __init__(self, cache: Any):
        self.cache = cache

    def collect(self) -> Iterable[Any]:
        stats = self.cache.stats
        for name, text in self.COUNTERS:
            yield CounterMetricFamily(f"lumotree_prefix_cache_{name}", text, value=getattr(stats, name))
        yield GaugeMetricFamily("lumotree_prefix_cache_bytes", "bytes the prefix cache holds", value=stats.bytes)
        yield GaugeMetricFamily("lumotree_prefix_cache_budget_bytes", "the prefix cache's budget (--prefix-cache)",
                                value=self.cache.budget_bytes)
