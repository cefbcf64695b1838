"""Programmatic dependent launch (PDL, compute capability 9.0 and up): a kernel launched with the PDL attribute may
start while the kernel before it in the stream is still running, once every program of that kernel has signalled
``griddepcontrol.launch_dependents`` (or exited). It must execute ``griddepcontrol.wait`` (which returns once the
previous kernel has completed and its writes are visible) before it touches any memory that kernel may write or read.

:func:`~lumotree.optimized.gemv.small_batch_linear` is launched with PDL (its programs then sit resident at the wait
when the previous kernel ends: the B = 1 decode step of the bench model replays in 1583 instead of 1629 us on the
H200; prefetching weight tiles into L2 before the wait made it slower, 1669-1960 us: ``bench/decode_probe.py --what
pdl``), and so are the model's other kernels of a step (GDN, norms, attention; :func:`pdl_begin` with
:func:`pdl_mode`): each waits for its predecessor first, then lets its successor launch under its tail. A GEMV
signals before its own wait at decode sizes and after it for tree steps (``gemv.EARLY_TRIGGER_MAX_ROWS``: a chain
of tree-step GEMVs all resident and waiting made the B = 16 decode step 7 % slower). The signal alone changes
nothing for a successor launched without PDL (it starts after completion, as always); both instructions are no-ops
when PDL is not in use.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import interpreting

__all__ = ["pdl_supported", "pdl_mode", "pdl_launch", "pdl_begin", "LAUNCH_KERNELS"]

LAUNCH_KERNELS = True  # launch the model's other kernels with PDL too (mode 2), not only the GEMV (an A / B knob)

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


def pdl_mode(device: torch.device | str) -> int:
    """The ``MODE`` of :func:`pdl_begin` for a kernel launched on ``device``: 0 without PDL support, 2 (launched
    with PDL: wait, then signal) when :data:`LAUNCH_KERNELS`, else 1 (launched plainly, signal only)."""
    if not pdl_supported(device):
        return 0
    return 2 if LAUNCH_KERNELS else 1


def pdl_launch(mode: int) -> dict:
    """Launch options of a kernel of :func:`pdl_mode` ``mode``."""
    return {"launch_pdl": True} if mode == 2 else {}


@triton.jit
def pdl_begin(MODE: tl.constexpr):
    """The first statement of a kernel of PDL mode ``MODE`` (a constant, so that the interpreter never sees the
    instructions): 2, launched with PDL: wait until the previous kernel has completed and its writes are visible
    (before any memory access), then let the next kernel launch; 1: only let the next kernel launch; 0: nothing.
    Signalling after the wait keeps at most one kernel resident and waiting behind a running one."""
    if MODE == 2:
        tl.extra.cuda.gdc_wait()
    if MODE >= 1:
        tl.extra.cuda.gdc_launch_dependents()
