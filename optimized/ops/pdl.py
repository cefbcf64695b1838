"""Programmatic dependent launch (PDL, compute capability 9.0 and up): a kernel launched with the PDL attribute may
start while the kernel before it in the stream is still running, once every program of that kernel has signalled
``griddepcontrol.launch_dependents`` (or exited). It must execute ``griddepcontrol.wait`` (which returns once the
previous kernel has completed and its writes are visible) before it touches any memory that kernel may write or read.

In this project :func:`~lumotree.optimized.ops.gemv.small_batch_linear` is launched with PDL (its programs then sit
resident at the wait when the previous kernel ends: the B = 1 decode step of the bench model replays in 1583 instead
of 1629 us on the H200; prefetching weight tiles into L2 before the wait made it slower, 1669-1960 us). The kernels
that precede it in a decode step call :func:`allow_dependents`
at their start, so that the GEMV can launch under their tail; a GEMV signals before its own wait at decode sizes
and after it for tree steps (``gemv.EARLY_TRIGGER_MAX_ROWS``: a chain of tree-step GEMVs all resident and waiting
made the B = 16 decode step 7 % slower). Two more kernels are PDL-launched where it measured faster, each moving
what the previous kernel does not write towards the SMs before its wait (:func:`prefetch_l2`): the one-kernel GDN
tree verify prefetches its ``S0`` tiles where its config asks for it (``gdn_tree.KernelConfig.pdl``), and the tree
attention at B = 1 its splits' committed K / V behind ``prepare_qkv``, which signals
at its start (decode 1353 -> 1345 us; slower at B = 16). Launching the
model's other kernels with PDL as well (each waiting, then signalling) measured slower at every point, and so did
a PDL-launched gated RMSNorm behind a signalling GDN verify (verify 2041 -> 2051 us at B = 1, 9457 -> 9595 us at
B = 16): not done. The signal alone changes nothing
for a successor launched without PDL (it starts after completion, as always); both instructions are no-ops when
PDL is not in use.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .checks import interpreting

__all__ = ["pdl_supported", "allow_dependents", "prefetch_l2"]

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


@triton.jit
def prefetch_l2(ptrs):
    """``prefetch.global.L2`` of the lines holding ``ptrs`` (any shape of pointers; nothing is returned or waited
    for): a PDL-launched kernel can move what does not depend on the previous kernel towards the SMs before its
    wait. Inline PTX: never under the interpreter (callers guard it with their PDL constant)."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)
