"""``lumotree bench NAME``: the benchmarks, each a module with ``add_arguments`` / ``run``: ``e2e`` (end-to-end decoding
throughput of the engine, :mod:`lumotree.optimized.engine.e2e`), ``tp`` (tensor-parallel scaling,
:mod:`lumotree.optimized.parallel.bench`) and ``serve`` (a server under multi-turn agent load,
:mod:`lumotree.server.loadgen`)."""

from __future__ import annotations

import argparse
import importlib

__all__ = ["add_arguments", "run", "BENCHMARKS"]

#: name -> (module, one-line help)
BENCHMARKS = {
    "e2e": ("lumotree.optimized.engine.e2e", "end-to-end decoding throughput of the engine"),
    "tp": ("lumotree.optimized.parallel.bench",
           "tensor-parallel scaling: decode step against floor + collectives, tokens/s per batch and size"),
    "serve": ("lumotree.server.loadgen",
              "TTFT, TPOT, latency and goodput of servers under multi-turn agent conversations"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="benchmark", metavar="NAME", required=True)
    for name, (module, help_text) in BENCHMARKS.items():
        bench_parser = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(bench_parser)
        bench_parser.set_defaults(benchmark_module=module)


def run(args: argparse.Namespace) -> int:
    return int(importlib.import_module(args.benchmark_module).run(args) or 0)
