r"""``lumotree bench serve``: servers under multi-turn agent load (also ``python bench/serve.py``).

Workload: ``--conversations`` agent conversations start at Poisson arrivals of ``--rates`` conversations per second.
A conversation runs ``--turns`` turns one after another: each turn's prompt is the conversation so far (a system
prompt of ``--system-words`` words that every conversation shares, every earlier prompt and answer) plus a tool output of ``--tool-words`` words, a share ``--copy-fraction`` of which repeats a span of
the conversation (agents read back files and logs they saw before: the repetition n-gram drafters feed on), the rest
fresh random words. Words are numbers below ``--word-range``, which are text to a tokenizer and token ids to a model
served without one. Each turn is a streamed ``/v1/completions`` request (``--max-tokens``, ``--temperature``); a
conversation ends early when its next prompt would not fit the model's context. The conversations, and so the prompts,
are the same for every server and rate (``--seed``).

Servers: ``--url`` measures a running server; ``--launch "OPTIONS"`` starts ``lumotree serve OPTIONS --spec S`` for each
``S`` of ``--specs`` (default ``none tree``: autoregressive against tree speculation on one model) on a free port,
measures it at every rate, and stops it; with ``--prefix-caches`` (sizes, ``0``: off) it does so for each size too
(``lumotree serve ... --prefix-cache SIZE``): the prefix cache on against off.

Per server and rate: time to first token (TTFT), time per output token after the first (TPOT) and end-to-end latency,
each at p50 / p90 / p99, and the TTFT of turns >= 2 alone (the prompts that extend a cached conversation);
output tokens per second; goodput (completed requests per second whose TTFT and TPOT meet
``--slo-ttft`` and ``--slo-tpot``) and the share that met them; failed requests; and, read from the server's
``/metrics``, the mean accepted draft tokens per request-step and the share of prompt tokens restored from the prefix
cache. The JSON (``--out``) holds the summaries and every
request's numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from lumotree.errors import UsageError

__all__ = ["add_arguments", "run", "main", "make_conversations", "summarize", "plot", "RequestRecord", "LaunchedServer"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="a running server's base URL (http://host:port)")
    target.add_argument("--launch", metavar="OPTIONS",
                        help="start `lumotree serve OPTIONS --spec S` for each of --specs (e.g. \"--model ckpt/\")")
    parser.add_argument("--specs", nargs="+", choices=("none", "chain", "tree"), default=["none", "tree"],
                        help="with --launch: the speculation modes to compare")
    parser.add_argument("--prefix-caches", nargs="+", default=["0"], metavar="SIZE",
                        help="with --launch: the --prefix-cache sizes to compare (0: off), e.g. 0 2GiB")
    parser.add_argument("--rates", type=float, nargs="+", default=[0.5, 1.0, 2.0], help="conversations per second")
    parser.add_argument("--conversations", type=int, default=32, help="conversations per run")
    parser.add_argument("--turns", type=int, default=4, help="turns per conversation")
    parser.add_argument("--tool-words", type=int, default=256, help="words of each tool output")
    parser.add_argument("--system-words", type=int, default=0,
                        help="words of a system prompt every conversation starts with (the same for all)")
    parser.add_argument("--copy-fraction", type=float, default=0.5,
                        help="share of a tool output that repeats a span of the conversation")
    parser.add_argument("--word-range", type=int, default=200, help="words are the numbers 0 .. this - 1")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens each turn generates (at most)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--slo-ttft", type=float, default=2.0, help="goodput's time-to-first-token bound (s)")
    parser.add_argument("--slo-tpot", type=float, default=0.1, help="goodput's time-per-output-token bound (s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--startup-timeout", type=float, default=900.0,
                        help="with --launch: seconds a server may take to start (GPU warm-up included)")
    parser.add_argument("--time-limit", type=float, default=None, help="seconds after which no new run starts")
    parser.add_argument("--out", default="bench/baselines/serve.json", help="JSON results")
    parser.add_argument("--plot", help="a PNG of TTFT (all turns and turns >= 2), TPOT and goodput against the rate")


def check_arguments(args: argparse.Namespace) -> None:
    for name in ("conversations", "turns", "tool_words", "word_range", "max_tokens"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} = {getattr(args, name)}: must be at least 1")
    if args.system_words < 0:
        raise UsageError(f"--system-words = {args.system_words}: must be >= 0")
    if not all(math.isfinite(r) and r > 0 for r in args.rates):
        raise UsageError(f"--rates {args.rates}: every rate must be > 0 conversations per second")
    if not 0 <= args.copy_fraction <= 1:
        raise UsageError(f"--copy-fraction = {args.copy_fraction}: must lie in [0, 1]")
    if not (args.slo_ttft > 0 and args.slo_tpot > 0):
        raise UsageError("--slo-ttft and --slo-tpot must be > 0 seconds")
    if not 0 <= args.temperature <= 2:
        raise UsageError(f"--temperature = {args.temperature}: must lie in [0, 2]")
    from lumotree.optimized.engine.prefix_cache import parse_size

    for size in args.prefix_caches:
        try:
            parse_size(size)
        except ValueError as exc:
            raise UsageError(f"--prefix-caches {size}: {exc}") from None
    for option, path in (("--out", args.out), ("--plot", args.plot)):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise UsageError(f"{option} {path}: no such folder")


# ------------------------------------------------------------------------------------------------------ workload
def _system_prompt(args: argparse.Namespace) -> str:
    """``--system-words`` words drawn once from ``--seed`` (every conversation's start)."""
    rng = np.random.default_rng([args.seed, 7])
    return " ".join(str(w) for w in rng.integers(0, args.word_range, args.system_words))


def make_conversations(count: int, turns: int, tool_words: int, copy_fraction: float, word_range: int, seed: int
                  ) -> list[list[list[str]]]:
    """``count`` conversations of ``turns`` tool outputs (lists of words). A copied span is drawn from the
    conversation's own earlier tool outputs (the answers are not known in advance)."""
    rng = np.random.default_rng(seed)
    conversations = []
    for _ in range(count):
        seen: list[str] = []
        outputs = []
        for _ in range(turns):
            copied = int(round(copy_fraction * tool_words)) if seen else 0
            start = int(rng.integers(0, max(len(seen) - copied, 0) + 1))
            words = seen[start:start + copied] + [str(w) for w in rng.integers(0, word_range, tool_words - copied)]
            seen += words
            outputs.append(words)
        conversations.append(outputs)
    return conversations


@dataclass
class RequestRecord:
    """One turn's request as the client saw it (seconds since the run's start; NaN where it does not apply)."""

    conversation: int
    turn: int
    start: float
    ttft: float = math.nan
    tpot: float = math.nan
    latency: float = math.nan
    prompt_tokens: int = 0
    output_tokens: int = 0
    status: int = 0
    error: str = ""


async def _turn(client: Any, url: str, model: str, prompt: str, args: argparse.Namespace, record: RequestRecord,
                t0: float) -> str:
    """One streamed completion; fills ``record`` and returns the answer's text."""
    body = {"model": model, "prompt": prompt, "max_tokens": args.max_tokens, "temperature": args.temperature,
            "seed": args.seed, "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    record.start = start - t0
    pieces: list[str] = []
    first = None
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        record.status = response.status_code
        if response.status_code != 200:
            record.error = (await response.aread()).decode(errors="replace")[:200]
            return ""
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                record.error = chunk["error"].get("message", "")[:200]
                break
            if chunk.get("usage"):
                record.prompt_tokens = chunk["usage"]["prompt_tokens"]
                record.output_tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                if choice.get("text"):
                    first = first or time.perf_counter()
                    pieces.append(choice["text"])
    end = time.perf_counter()
    if first is not None and not record.error:
        record.ttft, record.latency = first - start, end - start
        if record.output_tokens > 1:
            record.tpot = (end - first) / (record.output_tokens - 1)
    return "".join(pieces)


async def _conversation(client: Any, url: str, model: str, context: int, index: int, delay: float,
                   outputs: list[list[str]], args: argparse.Namespace, t0: float) -> list[RequestRecord]:
    await asyncio.sleep(delay)
    history = _system_prompt(args)
    tokens_per_word = 0.0
    records = []
    for turn, words in enumerate(outputs):
        prompt = (history + " " + " ".join(words)).strip()
        if tokens_per_word and tokens_per_word * len(prompt.split()) + args.max_tokens > context:
            break  # the next prompt would not fit the context
        record = RequestRecord(index, turn, 0.0)
        records.append(record)
        try:
            answer = await _turn(client, url, model, prompt, args, record, t0)
        except Exception as exc:  # noqa: BLE001 - a failed request is a result, not the end of the benchmark
            record.error = f"{type(exc).__name__}: {exc}"[:200]
            break
        if record.error or record.status != 200:
            break
        tokens_per_word = max(tokens_per_word, record.prompt_tokens / max(len(prompt.split()), 1))
        history = prompt + " " + answer
    return records


def _metric_value(text: str, name: str) -> float:
    """A counter's value in a Prometheus text page (0 when absent)."""
    return next((float(line.split()[1]) for line in text.splitlines() if line.startswith(f"{name} ")), 0.0)


_PREFIX = ("lumotree_prefix_cache_hit_tokens_total", "lumotree_prefix_cache_query_tokens_total")


def _metric_sums(text: str, name: str) -> tuple[float, float]:
    """``(sum, count)`` of a histogram in a Prometheus text page."""
    values = {"sum": 0.0, "count": 0.0}
    for line in text.splitlines():
        for key in values:
            if line.startswith(f"{name}_{key} "):
                values[key] = float(line.split()[1])
    return values["sum"], values["count"]


async def _run_rate(url: str, rate: float, conversations: list[list[list[str]]], args: argparse.Namespace
                    ) -> dict[str, Any]:
    import httpx

    rng = np.random.default_rng(args.seed + 1)
    delays = np.cumsum(rng.exponential(1.0 / rate, len(conversations)))
    delays -= delays[0]
    limits = httpx.Limits(max_connections=len(conversations) + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=30.0), limits=limits) as client:
        card = (await client.get(f"{url}/v1/models")).json()["data"][0]
        page = (await client.get(f"{url}/metrics")).text
        before = _metric_sums(page, "lumotree_accepted_tokens_per_step")
        prefix_before = [_metric_value(page, name) for name in _PREFIX]
        t0 = time.perf_counter()
        context = int(card["max_model_len"])
        runs = await asyncio.gather(*(_conversation(client, url, card["id"], context, i, float(d), turns, args, t0)
                                      for i, (d, turns) in enumerate(zip(delays, conversations))))
        duration = time.perf_counter() - t0
        page = (await client.get(f"{url}/metrics")).text
        after = _metric_sums(page, "lumotree_accepted_tokens_per_step")
        hit, query = (_metric_value(page, name) - b for name, b in zip(_PREFIX, prefix_before))
    records = [r for conversation in runs for r in conversation]
    steps = after[1] - before[1]
    summary = summarize(records, duration, args.slo_ttft, args.slo_tpot)
    summary["mean_accepted_per_step"] = (after[0] - before[0]) / steps if steps else 0.0
    summary["prefix_cache_hit_share"] = hit / query if query else 0.0
    return {"rate": rate, "model": card["id"], "summary": summary, "requests": [asdict(r) for r in records]}


def summarize(records: list[RequestRecord], duration: float, slo_ttft: float, slo_tpot: float) -> dict[str, Any]:
    """Percentiles, throughput and goodput of one run's requests."""
    done = [r for r in records if not r.error and r.status == 200 and not math.isnan(r.latency)]
    out: dict[str, Any] = {"requests": len(records), "completed": len(done), "failed": len(records) - len(done),
                           "duration_s": duration}
    for key, rows in (("ttft", done), ("tpot", done), ("latency", done),
                      ("ttft_turn2", [r for r in done if r.turn >= 1])):  # turn >= 2 (turns count from 0)
        values = np.array([getattr(r, key[:4] if key.startswith("ttft") else key) for r in rows])
        values = values[~np.isnan(values)] if len(values) else values
        for q in (50, 90, 99):
            out[f"{key}_p{q}_s"] = float(np.percentile(values, q)) if len(values) else math.nan
    good = [r for r in done if r.ttft <= slo_ttft and (math.isnan(r.tpot) or r.tpot <= slo_tpot)]
    out["output_tokens_per_s"] = sum(r.output_tokens for r in done) / duration if duration > 0 else 0.0
    out["goodput_requests_per_s"] = len(good) / duration if duration > 0 else 0.0
    out["slo_attainment"] = len(good) / len(records) if records else 0.0
    return out


# ------------------------------------------------------------------------------------------------------ servers
class LaunchedServer:
    """``lumotree serve OPTIONS`` in a child process on a free port (``url``); its stderr is collected in ``log``.
    :meth:`stop` sends a signal (SIGINT: a graceful shutdown), kills it if it does not exit, and returns its exit
    code."""

    def __init__(self, options: list[str], startup_timeout: float, log_level: str = "warning"):
        self.process = subprocess.Popen([sys.executable, "-m", "lumotree", "serve", *options, "--port", "0",
                                         "--log-level", log_level], stderr=subprocess.PIPE, text=True)
        self.log: list[str] = []
        self.url = ""
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        self._ready.wait(startup_timeout)
        if not self.url:
            self.stop(signal.SIGKILL)
            raise RuntimeError(f"lumotree serve {' '.join(options)} did not start: {''.join(self.log[-5:]).strip()}")

    def _read(self) -> None:
        for line in self.process.stderr:
            self.log.append(line)
            if not self.url and " on http://" in line:
                self.url = line.split(" on ", 1)[1].split()[0]
                self._ready.set()
        self._ready.set()

    def stop(self, sig: int = signal.SIGINT, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def run(args: argparse.Namespace) -> int:
    from lumotree.optimized.engine.prefix_cache import parse_size

    check_arguments(args)
    conversations = make_conversations(args.conversations, args.turns, args.tool_words, args.copy_fraction,
                                       args.word_range, args.seed)
    targets = [("url", [])] if args.url else [
        (f"{spec}+prefix {size}" if parse_size(size) else spec, ["--spec", spec, "--prefix-cache", size])
        for spec in args.specs for size in args.prefix_caches]
    config = {k: v for k, v in vars(args).items() if k not in ("benchmark", "benchmark_module")}
    results: dict[str, Any] = {"benchmark": "serve", "config": config, "runs": []}
    start = time.perf_counter()
    for label, options in targets:
        if args.time_limit is not None and time.perf_counter() - start > args.time_limit:
            break
        server = None if args.url else LaunchedServer([*shlex.split(args.launch), *options], args.startup_timeout)
        try:
            url = (args.url or server.url).rstrip("/")
            for rate in args.rates:
                if args.time_limit is not None and time.perf_counter() - start > args.time_limit:
                    break
                result = asyncio.run(_run_rate(url, rate, conversations, args))
                result["server"] = label
                results["runs"].append(result)
                print(_row(label, result), flush=True)
                with open(args.out, "w") as f:
                    json.dump(results, f, indent=1)
        finally:
            if server is not None:
                server.stop()
    if args.plot and results["runs"]:
        plot(results, args.plot)
    return 0


def plot(results: dict[str, Any], path: str) -> None:
    """TTFT p50 (all turns, and turns >= 2), TPOT p50 / p99 and goodput against the rate, one line a server."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for label in dict.fromkeys(r["server"] for r in results["runs"]):
        runs = sorted((r for r in results["runs"] if r["server"] == label), key=lambda r: r["rate"])
        rates = [r["rate"] for r in runs]
        line = axes[0].plot(rates, [r["summary"]["ttft_p50_s"] for r in runs], marker="o", label=f"{label}: all")
        axes[0].plot(rates, [r["summary"]["ttft_turn2_p50_s"] for r in runs], "--", marker="s",
                     color=line[0].get_color(), label=f"{label}: turns >= 2")
        line = axes[1].plot(rates, [1e3 * r["summary"]["tpot_p50_s"] for r in runs], marker="o", label=f"{label}: p50")
        axes[1].plot(rates, [1e3 * r["summary"]["tpot_p99_s"] for r in runs], ":", marker="^",
                     color=line[0].get_color(), label=f"{label}: p99")
        axes[2].plot(rates, [r["summary"]["goodput_requests_per_s"] for r in runs], marker="o", label=label)
    for ax, ylabel in zip(axes, ("TTFT p50 (s)", "TPOT (ms)", "goodput (requests/s in SLO)")):
        ax.set_xlabel("conversations per second")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("lumotree serve under multi-turn agent load")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _row(label: str, result: dict[str, Any]) -> str:
    s = result["summary"]
    return (f"{label:>5} rate {result['rate']:g}/s: {s['completed']}/{s['requests']} done, TTFT p50/p90/p99 "
            f"{s['ttft_p50_s']:.3f}/{s['ttft_p90_s']:.3f}/{s['ttft_p99_s']:.3f} s (turns >= 2: p50 "
            f"{s['ttft_turn2_p50_s']:.3f} s, prefix-cache hits {100 * s['prefix_cache_hit_share']:.0f} % of prompt "
            f"tokens), TPOT p50/p90/p99 "
            f"{1e3 * s['tpot_p50_s']:.1f}/{1e3 * s['tpot_p90_s']:.1f}/{1e3 * s['tpot_p99_s']:.1f} ms, latency p50 "
            f"{s['latency_p50_s']:.2f} s, {s['output_tokens_per_s']:.1f} tok/s, goodput "
            f"{s['goodput_requests_per_s']:.2f} req/s ({100 * s['slo_attainment']:.0f} % in SLO), accepted/step "
            f"{s['mean_accepted_per_step']:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/serve.py", description=__doc__.splitlines()[0])
    add_arguments(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    return run(parser.parse_args(argv[1:] if argv[:1] == ["serve"] else argv))
