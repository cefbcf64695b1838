"""CUDA graphs of the model's steps, one per shape: captured at the first call (after an eager run that compiles the
kernels), replayed from then on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["GraphCache"]


class GraphCache:
    """Graphs by key (``("verify", B, N, ...)`` and so on) on one CUDA device. A replayed graph's result is its
    static output: valid until the next replay of the same key."""

    def __init__(self, device: torch.device):
        self.device = device
        self.entries: dict[tuple, dict] = {}

    def clear(self) -> None:
        self.entries.clear()

    def result(self, key: tuple) -> Any:
        """The static result of ``key``'s graph, or None before its capture."""
        entry = self.entries.get(key)
        return None if entry is None else entry["result"]

    def run(self, key: tuple, inputs: dict[str, torch.Tensor], body: Callable[..., Any]) -> Any:
        """``body(**inputs)``: eager on the first call of ``key`` (it compiles; the eager run doubles as the capture's
        warm-up on a side stream), captured right after, replayed from then on (``inputs`` copied into the graph's
        static buffers first; host inputs take one copy)."""
        entry = self.entries.get(key)
        if entry is None:
            static = {name: t.to(self.device, copy=True) for name, t in inputs.items()}
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                result = body(**static)
            torch.cuda.current_stream(self.device).wait_stream(side)
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = body(**static)
            self.entries[key] = {"graph": graph, "static": static, "result": captured}
            return result
        for name, t in inputs.items():
            entry["static"][name].copy_(t)
        entry["graph"].replay()
        return entry["result"]

    def run_captured(self, key: tuple, inputs: dict[str, torch.Tensor], body: Callable[..., Any]) -> Any:
        """``body(**inputs)`` through a graph captured at its first call without an eager run (for a body whose
        kernels an earlier graph compiled and that must run exactly once, such as a commit), replayed after."""
        entry = self.entries.get(key)
        if entry is None:
            static = {name: t.to(self.device, copy=True) for name, t in inputs.items()}
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = body(**static)
            entry = self.entries[key] = {"graph": graph, "static": static, "result": captured}
        for name, t in inputs.items():
            entry["static"][name].copy_(t)
        entry["graph"].replay()
        return entry["result"]
