"""Programmatic dependent launch (PDL, compute capability 9.0 and up): a kernel launched with the PDL attribute may
start while the kernel before it in the stream is still running, once every program of that kernel has signalled
``griddepcontrol.launch_dependents`` (or exited). It must execute ``griddepcontrol.wait`` (which returns once the
previous kernel has completed and its writes are visible) before it touches any memory that kernel may write or read.

In this project only :func:`~lumotree.optimized.gemv.small_batch_linear` is launched with PDL (its programs then sit
resident at the wait when the previous kernel ends: the B = 1 decode step of the bench model replays in 1583 instead
of 1629 us on the H200; prefetching weight tiles into L2 before the wait made it slower, 1669-1960 us:
``bench/decode_probe.py --what pdl``). The kernels that precede it in a decode step call :func:`allow_dependents`
at their start, so that the GEMV can launch under their tail; a GEMV signals before its own wait at decode sizes
and after it for tree steps (``gemv.EARLY_TRIGGER_MAX_ROWS``: a chain of tree-step GEMVs all resident and waiting
made the B = 16 decode step 7 % slower). Launching the model's other kernels with PDL as well (each waiting, then
signalling) measured slower at every point (bench/RESULTS.md, eighth session) and is not done. The signal alone
changes nothing for a successor launched without PDL (it starts after completion, as always); both instructions are
no-ops when PDL is not in use.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import interpreting

__all__ = ["pdl_supported", "allow_dependents"]

_CAPABLE: dict[tuple[str, int | None], bool] = {}


def pdl_supported(device: torch.device | str) -> bool:
    """True on a CUDA device of compute capability 9.0 or more, outside the Triton interpreter."""
    device = torch.device(device)
    if device.type != "cuda" or interpreting():
        return False
    key = (device.type, device.index)
    if key not in _CAPABLE:
        _CAPABLE[key] = torch.cuda.get_device_capability(device)[0] >= 9
    return _CAPABLE[key]


@triton.jit
def allow_dependents(ENABLED: tl.constexpr):
    """Let the next kernel of the stream launch now if it was launched with PDL (``ENABLED``: the device supports it;
    a constant so that the interpreter never sees the instruction)."""
    if ENABLED:
        tl.extra.cuda.gdc_launch_dependents()
