"""``--tensor-parallel N`` of ``lumotree generate`` and ``lumotree serve``: the option, the launch of one process per
rank (:func:`~lumotree.optimized.parallel.launch.launch`, torchrun-style; under ``torchrun`` each process already is
one), and each rank's process group and device (NCCL on GPUs, gloo on the CPU).

Every rank builds the same engine over its shard of the model (:mod:`lumotree.optimized.parallel`) and decodes the
same requests; the drafter and the budget decide on rank 0 and the plan of each step is broadcast. Only rank 0
prints results; ``lumotree serve`` listens on rank 0 and the other ranks follow its engine
(:mod:`lumotree.server.follow`).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from lumotree.errors import UsageError

__all__ = ["add_parallel_argument", "check_parallel_arguments", "launch_ranks", "join_group"]


def add_parallel_argument(group: Any) -> None:
    group.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                       help="ranks (one process per GPU, NCCL; on a CPU gloo with TRITON_INTERPRET=1): attention and "
                            "GDN heads, MLP columns, MoE experts and the vocabulary split over N processes; started "
                            "here, or one per process under torchrun")


def check_parallel_arguments(args: argparse.Namespace, backend: str) -> None:
    """``--tensor-parallel``'s value and what it needs (the optimized backend); under a launch of several processes
    (torchrun) it defaults to their number."""
    world = os.environ.get("WORLD_SIZE")
    if args.tensor_parallel == 1 and world is not None and int(world) > 1:
        args.tensor_parallel = int(world)
    n = args.tensor_parallel
    if n < 1:
        raise UsageError(f"--tensor-parallel = {n}: must be at least 1")
    if n > 1 and backend != "optimized":
        raise UsageError(f"--tensor-parallel {n} needs --backend optimized (a GPU per rank, or TRITON_INTERPRET=1 "
                         "on a CPU)")
    if n > 1 and world is not None and int(world) != n:
        raise UsageError(f"--tensor-parallel {n} under a launch of WORLD_SIZE = {world} processes")


def launch_ranks(args: argparse.Namespace) -> int | None:
    """With ``--tensor-parallel N > 1`` outside a launch: run this command line in N ranks and return its exit code;
    else None (this process decodes, alone or as one rank)."""
    from lumotree.optimized.parallel.launch import launch, launched

    if args.tensor_parallel <= 1 or launched():
        return None
    return launch(args.tensor_parallel, args.command_line)


def join_group(args: argparse.Namespace) -> tuple[Any, Any]:
    """``(Parallel, device)`` of this process: the group of ``--tensor-parallel`` ranks, or one process."""
    import torch

    from lumotree.optimized.parallel import SINGLE, init_parallel

    if args.tensor_parallel <= 1:
        return SINGLE, torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return init_parallel(args.tensor_parallel)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
