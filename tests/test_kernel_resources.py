"""Compile-only resource checks of the GDN tree kernels for Hopper (sm_90), no GPU needed.

A kernel that compiles to a pathological register allocation still computes the right values, so the differential
tests cannot see it: an overlapped doubling in ``ieee`` mode once compiled to 32 registers and ~8 KB of stack and ran
4x slower at B = 64. Here the default launch configs at Qwen3-Next shapes, N = 64 and 128, are compiled for sm_90
(:mod:`lumotree.optimized.ops.gdn_tree.resources`: Triton's own ptxas and cuobjdump, in a subprocess without
``TRITON_INTERPRET``) and each kernel must keep a sane allocation in every precision mode, and no matrix product whose
layout spans more rows than the product has.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lumotree.optimized.ops.gdn_tree.resources import tools_present

MAX_STACK_BYTES = 4096  # every default kernel: 0-1.9 KB (Triton 3.6 / 3.9); the pathological solve 7.8-8.1 KB
MIN_REGISTERS = 64  # the pathological solve: 32 registers (everything in local memory)


@pytest.mark.skipif(not tools_present(), reason="Triton's NVIDIA ptxas / cuobjdump are not installed")
@pytest.mark.parametrize("nodes", [64, 128])
@pytest.mark.parametrize("precision", ["tf32", "tf32x3", "ieee"])
def test_default_kernels_compile_without_pathological_spills(precision, nodes):
    """The verify kernels of the B = 64 and B = 1 default configs (one row each where both share a kernel) and the
    B = 64 commit."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-m", "lumotree.optimized.ops.gdn_tree.resources", "--precision", precision,
                          "--nodes", str(nodes)], capture_output=True, text=True, env=env, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    labels = [row["label"] for row in rows]
    assert "commit B=64" in labels and any(label.endswith("[apply]") for label in labels), labels
    assert any(label.endswith(("[solve]", "[solve rows]")) for label in labels), labels  # split at B = 64
    for row in rows:
        assert "error" not in row, row
        assert row["stack"] <= MAX_STACK_BYTES and row["regs"] >= MIN_REGISTERS, row
        # no product laid out over more rows than it has (at 8 warps, a 64-row product that feeds another read
        # shared memory out of range on the H200). tf32x3's three-product split chains every product, so its 8-warp
        # small-batch solve at N = 128 keeps such layouts (clean under compute-sanitizer's memcheck)
        if not (precision == "tf32x3" and nodes == 128 and row["label"] == "verify B=1 [solve rows]"):
            assert row["overcovered"] == 0, row
