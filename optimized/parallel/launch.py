r"""Start one process per rank, torchrun-style: ``lumotree generate --tensor-parallel N`` (and ``serve``) re-runs its
own command line in ``N`` processes with torchrun's environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) plus :data:`~.context.NO_MULTICAST_ENV` (NVLink multicast
off), and waits for them. Under ``torchrun`` (``WORLD_SIZE`` already set) nothing is started: each process is a rank.

Rank 0 writes to this process's stdout and stderr; the other ranks' output is dropped, except their stderr when they
fail. SIGINT and SIGTERM go to rank 0 only (each rank starts in a process group of its own), which ends the others
through its engine (``lumotree serve`` tells them to stop) or by failing; when one rank fails the others are stopped
(a rank waiting in a collective would wait for ever).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from .context import NO_MULTICAST_ENV

__all__ = ["launch", "launched", "rank_env"]


def launched() -> bool:
    """Whether this process is one rank of a launch (``WORLD_SIZE`` set: torchrun's or :func:`launch`'s)."""
    return "WORLD_SIZE" in os.environ


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_env(rank: int, world: int, port: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of rank ``rank`` of ``world`` on this host (rendezvous at ``127.0.0.1:port``)."""
    env = dict(os.environ if base is None else base)
    env.update(NO_MULTICAST_ENV)
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return env


def launch(world: int, argv: Sequence[str], poll_s: float = 0.05) -> int:
    """Run ``python -m lumotree ARGV`` as ranks ``0 .. world - 1`` (module docstring); returns the first non-zero
    exit code of a rank (128 + the signal for one a signal ended), else 0."""
    if isinstance(world, bool) or not isinstance(world, int) or world < 2:
        raise ValueError(f"tensor_parallel = {world!r}: launching needs at least 2 processes")
    port = _free_port()
    procs, logs = [], []
    for rank in range(world):
        log = None if rank == 0 else tempfile.TemporaryFile()
        logs.append(log)
        procs.append(subprocess.Popen([sys.executable, "-m", "lumotree", *argv], env=rank_env(rank, world, port),
                                      stdout=None if rank == 0 else subprocess.DEVNULL,
                                      stderr=None if rank == 0 else log, start_new_session=True))
    forward = lambda sig, frame: procs[0].poll() is None and procs[0].send_signal(sig)  # noqa: E731
    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    code = 0
    try:
        while any(p.poll() is None for p in procs):
            failed = [p for p in procs if p.poll() not in (None, 0)]
            if failed:
                code = failed[0].returncode
                break
            time.sleep(poll_s)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    codes = [p.returncode for p in procs]
    code = code or next((c for c in codes if c), 0)
    code = 128 - code if code < 0 else code  # killed by a signal: the shell's convention
    for rank, (c, log) in enumerate(zip(codes, logs)):
        if log is not None:
            if c not in (0, None) and code and c > 0:
                log.seek(0)
                text = log.read().decode(errors="replace").strip().splitlines()
                if text:
                    sys.stderr.write(f"rank {rank}: {text[-1]}\n")
            log.close()
    return code
