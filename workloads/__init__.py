"""Workloads built from held-out corpus files: code completion, agentic edit and a multi-turn tool loop, as JSONL
files with a fixed seed, and the loader the benchmarks and the server read them with."""

from __future__ import annotations

from .build import WORKLOADS, Item, build_workload, load_workload, write_workloads

__all__ = ["WORKLOADS", "Item", "build_workload", "load_workload", "write_workloads"]
