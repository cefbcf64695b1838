"""Triton's NVIDIA tools and the resources of a compiled kernel, for the compile-only reports of the op packages
(``gdn_tree.resources``, ``moe.resources``): no GPU needed, only the ``ptxas`` and ``cuobjdump`` Triton ships."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

import triton

__all__ = ["nvidia_tool", "tools_present", "cubin_resources"]


def nvidia_tool(name: str) -> str:
    """Path of the NVIDIA tool ``name`` in Triton's backend."""
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def tools_present() -> bool:
    """Whether Triton ships the NVIDIA ``ptxas`` and ``cuobjdump`` the reports need."""
    return os.path.exists(nvidia_tool("ptxas")) and os.path.exists(nvidia_tool("cuobjdump"))


def cubin_resources(compiled) -> dict:
    """``regs``, ``stack`` (bytes a thread) from ``cuobjdump -res-usage`` of a compiled kernel's cubin (-1: not
    reported) and ``smem`` (bytes a program) from its metadata."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        text = subprocess.run([nvidia_tool("cuobjdump"), "-res-usage", f.name], capture_output=True,
                              text=True).stdout
    usage = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", text))
    return dict(regs=int(usage.get("REG", -1)), stack=int(usage.get("STACK", -1)), smem=int(compiled.metadata.shared))
