"""The engine's start-up work: the cost profile its budget prices tree sizes with (measured at every (batch, node)
bucket, bounded in time, keyed for a cache), and the warm-up that compiles the kernels and captures the CUDA graphs of
every step shape before the first request."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .budget import CostProfile
from .sampling import TreeBatch

__all__ = ["measure_profile", "profile_key", "warm_up"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_profile(engine: Any, repeats: int = 5, prompt_len: int = 16, time_limit: float | None = None
                ) -> CostProfile:
    """Time decode (+ argmax to the host) and a greedy speculative step's model part (tree packing, verify, greedy
    acceptance, commit, emitted tokens: :meth:`step`'s path) at every (batch, node) bucket on free slots, with
    random tokens and random trees (median of ``repeats`` after two warm-up calls). Slots are prefilled again
    (untimed) when the next call could run out of context. Needs every slot free. ``time_limit``: seconds after
    which the verify buckets not yet measured are extrapolated (:meth:`CostProfile.measure`)."""
    if len(engine.free_slots) < engine.model.num_slots:
        raise RuntimeError("measure_profile needs every slot free (call it before submitting requests)")
    dev = engine.model.device
    gen = torch.Generator().manual_seed(1234)
    V = engine.model.vocab_size
    prompt_len = min(prompt_len, engine.model.max_seq_len - engine.max_nodes - 2)
    if prompt_len < 1:
        raise ValueError(f"max_seq_len = {engine.model.max_seq_len} is too short to measure a cost profile")
    rng = np.random.default_rng(0)
    length: dict[int, int] = {}  # cache length of each slot in use

    def make_room(batch: int, nodes: int) -> None:
        """Slots 0..batch-1, each prefilled (again) unless it has room for a step of ``nodes`` nodes."""
        for s in range(batch):
            if length.get(s, engine.model.max_seq_len) + nodes + 1 >= engine.model.max_seq_len:
                if s in length:
                    engine.model.release(s)
                engine.model.prefill(s, torch.randint(V, (prompt_len,), generator=gen).tolist())
                length[s] = prompt_len

    def run_timed(fn: Callable[[], None], prepare: Callable[[], None]) -> float:
        times = []
        for i in range(repeats + 2):  # two warm-up calls: the first compiles and captures, the second replays
            prepare()
            _sync(dev)
            t0 = time.perf_counter()
            fn()
            _sync(dev)
            if i >= 2:
                times.append(time.perf_counter() - t0)
        return float(np.median(times))

    def time_decode(batch: int) -> float:
        slots = torch.tensor(list(range(batch)), dtype=torch.int64)
        tokens = torch.randint(V, (batch,), generator=gen).to(dev)

        def once() -> None:
            engine.model.decode(slots, tokens).argmax(-1).tolist()
            for s in range(batch):
                length[s] += 1

        return run_timed(once, lambda: make_room(batch, 1))

    def time_verify(batch: int, nodes: int) -> float:
        slots = torch.tensor(list(range(batch)), dtype=torch.int64)
        parents = [[-1] + [int(rng.integers(0, i)) for i in range(1, nodes)] for _ in range(batch)]
        tokens = [[i % V for i in range(nodes)] for _ in range(batch)]  # distinct where the vocabulary allows

        def once() -> None:  # the model part of a greedy speculative step as the engine runs it
            trees = TreeBatch.pack(tokens, parents, width=nodes)  # on the host
            outcome = engine.speculate_greedy_step(slots, trees)
            outcome.emitted(trees)
            for s, a in enumerate(outcome.accepted_len.tolist()):
                length[s] += a + 1

        return run_timed(once, lambda: make_room(batch, nodes))

    try:
        profile = CostProfile.measure(
            time_decode, time_verify, engine.batch_buckets, engine.node_buckets, device=str(dev),
            note=f"measured by Engine.measure_profile, median of {repeats}", time_limit=time_limit,
            clock=lambda: engine.parallel.broadcast_object(time.perf_counter()),  # rank 0's (one process: its own)
        )
    finally:
        for s in length:
            engine.model.release(s)
    return profile

def profile_key(engine: Any) -> dict:
    """What a cost profile depends on: the model (config, dtype, slots, nodes), the device and the buckets (the
    key of :func:`~lumotree.optimized.engine.budget.profile_cache_path`)."""
    import dataclasses

    from lumotree import __version__

    inner = getattr(engine.model, "model", engine.model)
    config = getattr(inner, "config", None)
    dev = torch.device(engine.model.device)
    return {
        "lumotree": __version__, "target": type(engine.model).__name__,
        "config": dataclasses.asdict(config) if dataclasses.is_dataclass(config) else repr(config),
        "dtype": str(getattr(inner, "dtype", "float64")), "slots": engine.model.num_slots,
        "max_seq_len": engine.model.max_seq_len, "max_nodes": engine.max_nodes,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type,
        "interpreter": os.environ.get("TRITON_INTERPRET", "0"), "batch_buckets": list(engine.batch_buckets),
        "node_buckets": list(engine.node_buckets), **({"tensor_parallel": engine.parallel.world}
                                                      if engine.parallel.active else {}),
    }

def warm_up(engine: Any, sampling: bool = False, progress: Callable[[str], None] | None = None) -> float:
    """Run every step shape this engine can take once on free slots, so that kernels compile and CUDA graphs are
    captured before the first request: a prefill, the decode step at every batch bucket and (speculative modes)
    the greedy tree step at every (batch, node) bucket, with ``sampling`` the verify + commit too, then the drafter's
    own shapes when it has a ``warm_up(batch_sizes)`` (the MTP / EAGLE head, a draft model). Returns the seconds it
    took. Needs every slot free."""
    if len(engine.free_slots) < engine.model.num_slots:
        raise RuntimeError("warm_up needs every slot free (call it before submitting requests)")
    start = time.perf_counter()
    nodes = engine.node_buckets if engine.mode != "autoregressive" else ()
    shapes = [(b, 1) for b in engine.batch_buckets] + [(b, n) for b in engine.batch_buckets for n in nodes if n > 1]
    for i, (batch, n) in enumerate(shapes):
        if progress is not None:
            progress(f"{i + 1}/{len(shapes)}: {'decode' if n == 1 else 'tree'} B={batch} N={n}")
        for s in range(batch):
            engine.model.prefill(s, [s % engine.model.vocab_size] * 4)
        slots = torch.arange(batch, dtype=torch.int64)
        if n == 1:
            engine.model.decode(slots, torch.zeros(batch, dtype=torch.int64))
            continue
        trees = TreeBatch.pack([list(range(n))] * batch, [[-1] + [i // 2 for i in range(1, n)]] * batch,
                               width=n)  # [B, N] a binary tree of distinct tokens
        for _ in range(2):  # the first call compiles, the second captures
            engine.speculate_greedy_step(slots, trees)
            if sampling:
                engine.model.verify(slots, trees)
                engine.model.commit(slots, trees, torch.zeros(batch, dtype=torch.int64))
    for s in range(max(engine.batch_buckets)):
        engine.model.release(s)
    drafter_warm_up = getattr(engine.drafter, "warm_up", None)
    if engine.mode != "autoregressive" and callable(drafter_warm_up):  # the drafter's own shapes (a head, a model)
        if progress is not None:
            progress(f"the {getattr(engine.drafter, 'name', 'drafter')} drafter's shapes")
        drafter_warm_up(engine.batch_buckets)
    _sync(torch.device(engine.model.device))
    return time.perf_counter() - start
