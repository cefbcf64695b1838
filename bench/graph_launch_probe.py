"""Probe (GPU): host time of ``CUDAGraph.replay()`` (the ``cudaGraphLaunch`` call alone, after a synchronisation)
and wall time of replay + synchronisation, for the bench model's decode, verify and commit graphs at B = 1.

Run: ``PYTHONPATH=$PWD:$PWD/bench python bench/graph_launch_probe.py --out graph_launch.json``.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from lumotree.optimized import model as om
from lumotree.reference.config import HybridConfig
from lumotree.reference.tree import random_parents

from model_verify import CONFIG, set_lengths  # noqa: E402  (bench/ is the script's directory)


def host_and_wall_ms(graph: torch.cuda.CUDAGraph, reset, repeats: int = 30) -> tuple[float, float]:
    host, wall = [], []
    for _ in range(repeats):
        reset()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append(t1 - t0)
        wall.append(t2 - t0)
    return 1e3 * float(np.median(host)), 1e3 * float(np.median(wall))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="graph_launch.json")
    ap.add_argument("--L", type=int, default=256)
    args = ap.parse_args()
    dev = torch.device("cuda")
    model = om.build_random(HybridConfig(**CONFIG), seed=0, num_slots=1, max_seq_len=args.L + 512, max_nodes=64,
                            device=dev)
    rng = np.random.default_rng(0)
    slots = torch.zeros(1, dtype=torch.int32)
    reset = lambda: set_lengths(model, args.L)  # noqa: E731
    rows = []
    reset()
    model.decode(slots, torch.tensor([5]))
    model.decode(slots, torch.tensor([5]))
    host, wall = host_and_wall_ms(model._graph_entries[("decode", 1)]["graph"], reset)
    rows.append({"graph": "decode", "N": 1, "host_launch_ms": host, "wall_ms": wall})
    for N in (1, 16, 64):
        parents = torch.tensor([random_parents(N, rng)], dtype=torch.int32)
        tokens = torch.tensor(rng.integers(0, 1000, (1, N)))
        for _ in range(2):  # eager + capture, then a replay: the commit graph captures on the replayed record
            reset()
            model.verify(slots, tokens, parents, validate=False)
            model.commit(slots, torch.zeros(1, dtype=torch.int32), validate=False)
        host, wall = host_and_wall_ms(model._graph_entries[("verify", 1, N)]["graph"], reset)
        rows.append({"graph": "verify", "N": N, "host_launch_ms": host, "wall_ms": wall})
        host, wall = host_and_wall_ms(model._graph_entries[("commit", 1, N)]["graph"], reset)
        rows.append({"graph": "commit", "N": N, "host_launch_ms": host, "wall_ms": wall})
    for r in rows:
        print(json.dumps(r), flush=True)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
