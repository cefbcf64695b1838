r"""The process group of a tensor-parallel model and the collectives its steps make.

One process per device (rank ``r`` of ``P``). A :class:`Parallel` holds the group and the three collectives of a
step, each a no-op on one process (:data:`SINGLE`):

- :meth:`Parallel.all_reduce`: ``y = sum_r y_r`` of the row-parallel outputs (attention ``o_proj``, GDN
  ``out_proj``, MLP ``down_proj``, the MoE combine), in place;
- :meth:`Parallel.gather_vocab`: the vocabulary-parallel head's logits ``[T, V]`` from each rank's ``[T, V_r]``
  (rank ``r`` holds rows ``[r ceil(V / P), ...)``; shards padded with ``-inf`` to one width for the gather);
- :meth:`Parallel.argmax`: the greedy token of ``[T, V_r]`` shards without gathering them: each rank's (max, first
  index of the max) is gathered and the rank of the largest max wins, the lowest rank on ties, which is the lowest
  global id: exactly ``argmax`` of the full row (first maximal index) on one process.

Every collective keeps fixed shapes, so CUDA graphs capture them with NCCL (the communicator is set up by one
collective before any capture: :func:`init_parallel`). ``gloo`` (the CPU) runs the same code without graphs.
"""

from __future__ import annotations

import datetime
import os
import pickle
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Parallel", "SINGLE", "init_parallel", "vocab_range", "NO_MULTICAST_ENV"]

#: environment of every process a tensor-parallel launch starts: NVLink multicast (NVLS) and symmetric-memory
#: multicast stay off
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


def vocab_range(vocab: int, rank: int, world: int) -> tuple[int, int]:
    """Rows ``[first, end)`` of the LM head that rank ``rank`` of ``world`` holds: ``ceil(vocab / world)`` a rank,
    fewer (possibly none) on the last ones."""
    width = -(-vocab // world)
    return min(vocab, rank * width), min(vocab, (rank + 1) * width)


@dataclass(frozen=True)
class Parallel:
    """Rank ``rank`` of a tensor-parallel group of ``world`` processes (``group``: the torch.distributed group of
    the model's collectives, None on one process; ``control``: a gloo group on the host for :meth:`broadcast_object`,
    so that the plan of a step never waits in the device's stream and an idle server's ranks may wait long)."""

    rank: int = 0
    world: int = 1
    group: Any = None
    control: Any = None  # a gloo group for host objects (the plan of a step); None: ``group``

    @property
    def active(self) -> bool:
        return self.world > 1

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """``t = sum over ranks of t`` in place (the same bits on every rank); returns ``t``."""
        if self.active:
            torch.distributed.all_reduce(t, group=self.group)
        return t

    def _gather(self, t: torch.Tensor) -> torch.Tensor:
        """``[P, *t.shape]``: every rank's ``t`` (of one shape) stacked in rank order."""
        out = torch.empty((self.world, *t.shape), dtype=t.dtype, device=t.device)
        if t.device.type == "cuda":
            torch.distributed.all_gather_into_tensor(out, t.contiguous(), group=self.group)
        else:  # gloo: the list form
            torch.distributed.all_gather(list(out.unbind(0)), t.contiguous(), group=self.group)
        return out

    def _padded(self, local: torch.Tensor, vocab: int) -> torch.Tensor:
        """``local [T, V_r]`` padded with ``-inf`` columns to the shard width ``ceil(V / P)``."""
        width = -(-vocab // self.world)
        if local.shape[-1] == width:
            return local
        out = torch.full((local.shape[0], width), float("-inf"), dtype=local.dtype, device=local.device)
        out[:, : local.shape[-1]] = local
        return out

    def gather_vocab(self, local: torch.Tensor, vocab: int) -> torch.Tensor:
        """Logits ``[T, V]`` from this rank's shard ``local: [T, V_r]`` (:func:`vocab_range`) and the others'."""
        if not self.active:
            return local
        shards = self._gather(self._padded(local, vocab))  # [P, T, ceil(V / P)]
        return shards.permute(1, 0, 2).reshape(local.shape[0], -1)[:, :vocab]

    def argmax(self, local: torch.Tensor, vocab: int) -> torch.Tensor:
        """``argmax`` over the whole vocabulary of the rows whose shards ``local: [T, V_r]`` the ranks hold:
        ``[T]`` int64 global ids, ties to the lowest id (module docstring)."""
        if not self.active:
            return local.argmax(-1)
        padded = self._padded(local, vocab)  # [T, W]
        idx = padded.argmax(-1)  # [T] first maximal index of the shard
        both = torch.stack([padded.gather(1, idx[:, None])[:, 0].double(),
                            (idx + self.rank * padded.shape[-1]).double()])  # [2, T] (ids exact in float64)
        every = self._gather(both)  # [P, 2, T]
        best = every[:, 0].argmax(0)  # [T] lowest rank among the largest maxima
        return every[:, 1].gather(0, best[None])[0].long()

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """``obj`` of rank ``src`` on every rank (pickled; one byte-length broadcast and one payload broadcast, on
        the host through ``control``, else on ``group``'s device)."""
        if not self.active:
            return obj
        group = self.control if self.control is not None else self.group
        nccl = torch.distributed.get_backend(group) == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
        if self.rank == src:
            payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8).to(device)
            size = torch.tensor([payload.numel()], dtype=torch.int64, device=device)
        else:
            size = torch.zeros(1, dtype=torch.int64, device=device)
        torch.distributed.broadcast(size, src, group=group)
        if self.rank != src:
            payload = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
        torch.distributed.broadcast(payload, src, group=group)
        return obj if self.rank == src else pickle.loads(payload.cpu().numpy().tobytes())

    def least(self, value: int) -> int:
        """The smallest of every rank's ``value`` (an integer on the host)."""
        if not self.active:
            return int(value)
        t = torch.tensor([int(value)], dtype=torch.int64)
        group = self.control if self.control is not None else self.group  # the host group (gloo)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN, group=group)
        return int(t.item())

    def barrier(self) -> None:
        if self.active:
            torch.distributed.barrier(group=self.group)


#: one process: every collective a no-op
SINGLE = Parallel()


def init_parallel(world: int | None = None, backend: str | None = None) -> tuple[Parallel, torch.device]:
    """Join the process group described by the environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``MASTER_ADDR``, ``MASTER_PORT``: torchrun's, or :func:`~lumotree.optimized.parallel.launch.launch`'s) and
    return it with this process's device (``cuda:LOCAL_RANK`` with NCCL, else the CPU with gloo). ``world``: the
    size asked for (``--tensor-parallel``), checked against ``WORLD_SIZE``. Without ``WORLD_SIZE`` and ``world`` in
    (None, 1): :data:`SINGLE`. One all-reduce right after sets the communicator up (before any CUDA graph
    capture)."""
    env_world = int(os.environ.get("WORLD_SIZE", "1"))
    if world is not None and world != env_world and not (world == 1 and "WORLD_SIZE" not in os.environ):
        raise ValueError(f"tensor_parallel = {world} but WORLD_SIZE = {env_world}: launch one process per rank")
    if env_world == 1:
        return SINGLE, torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for key, value in NO_MULTICAST_ENV.items():
        os.environ.setdefault(key, value)
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        if local >= torch.cuda.device_count():
            raise ValueError(f"tensor_parallel = {env_world}: rank {rank} wants cuda:{local} but "
                             f"{torch.cuda.device_count()} GPU(s) are visible")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if not torch.distributed.is_initialized():
        kwargs = {"device_id": device} if backend == "nccl" else {}
        torch.distributed.init_process_group(backend, rank=rank, world_size=env_world, **kwargs)
    control = torch.distributed.new_group(backend="gloo", timeout=datetime.timedelta(days=7))
    par = Parallel(rank, env_world, torch.distributed.group.WORLD, control)
    par.all_reduce(torch.zeros(1, device=device))
    return par, device
