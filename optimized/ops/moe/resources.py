"""Compile-only check of the routed MoE kernels for Hopper (sm_90): no GPU needed.

:func:`default_kernel_resources` compiles every launch of :func:`~lumotree.optimized.ops.moe.moe_routed` with its
default config (:func:`~lumotree.optimized.ops.moe.moe_config`) at Qwen3-Next-80B-A3B's MoE shapes (hidden 2048,
512 experts of width 512, top 10, shared expert 512) and Qwen3.5-MoE's (256 experts, top 8), bf16, T = 1, 16, 64
and 1024 tokens, for ``GPUTarget("cuda", 90, 128)``: the launches the host code builds (on meta tensors), their
integer arguments specialised as the JIT specialises them. It reads registers, stack and shared memory from
``cuobjdump -res-usage`` (Triton's own tools). The interpreter checks the kernels' values on a CPU; this catches
what only the GPU compiler sees (an unsupported construct, spills).

``--fp8``: the experts and the shared expert as block FP8
(:class:`~lumotree.optimized.ops.gemv.Fp8Weight`, the FP8 releases' format), activations bf16.

Run ``python -m lumotree.optimized.ops.moe.resources [--models qwen3-next] [--fp8]`` (one JSON line a compiled
kernel), without ``TRITON_INTERPRET``.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton

from ..cubin import cubin_resources, tools_present
from ..gemv import Fp8Weight
from .routed import Launch, _launches, moe_config

__all__ = ["default_kernel_resources", "tools_present"]

MODELS = {"qwen3-next": (2048, 512, 512, 10, 512), "qwen3.5-moe": (2048, 256, 512, 8, 512)}  # Dm, E, I, k, Is
H200_SMS = 132
TOKENS = (1, 16, 64, 1024)
POINTER_TYPES = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.int32: "*i32",
                 torch.float8_e4m3fn: "*fp8e4nv"}


def _specialise(launch: Launch) -> tuple[dict, dict, dict, dict]:
    """``(signature, constexprs, attrs, options)`` of one launch as the JIT specialises it: an integer argument equal
    to 1 becomes a constant (unless the kernel opts out), one divisible by 16 is marked so, tensors 16-aligned."""
    kernel, options = launch.kernel, {k: v for k, v in launch.meta.items() if k in ("num_warps", "num_stages")}
    given = dict(zip(kernel.arg_names, launch.args), **{k: v for k, v in launch.meta.items() if k not in options})
    signature, constexprs, attrs = {}, {}, {}
    for i, param in enumerate(kernel.params):
        value = given[param.name]
        if param.is_constexpr:
            signature[param.name], constexprs[(i,)] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[param.name] = POINTER_TYPES[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif value == 1 and not param.do_not_specialize:
            signature[param.name], constexprs[(i,)] = "constexpr", 1
        else:
            signature[param.name] = "i32"
            if value % 16 == 0 and not param.do_not_specialize:
                attrs[(i,)] = [["tt.divisibility", 16]]
    return signature, constexprs, attrs, options


def _compile(kernel, signature: dict, constexprs: dict, attrs: dict, options: dict):
    """Triton's compile for sm_90."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    src = ASTSource(fn=kernel, signature=signature, attrs=attrs, constexprs=constexprs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 128), options=options)


def _default_launches(models: tuple[str, ...], fp8: bool = False) -> list[tuple[str, Launch]]:
    """``(label, launch)`` of :func:`moe_routed`'s default launches at each model's shapes and token count, as
    :func:`~lumotree.optimized.ops.moe.routed._launches` builds them on meta tensors (bf16; ``fp8``: block-FP8
    expert and shared weights)."""
    out = []
    for model in models:
        Dm, E, I, k, Is = MODELS[model]
        for T in TOKENS:
            def meta(*shape):
                return torch.empty(shape, dtype=torch.bfloat16, device="meta")

            def weight(*shape):  # [..., N, K] of the run's kind
                if not fp8:
                    return meta(*shape)
                *lead, N, K = shape
                return Fp8Weight(torch.empty(shape, dtype=torch.float8_e4m3fn, device="meta"),
                                 torch.empty((*lead, triton.cdiv(N, 128), triton.cdiv(K, 128)), dtype=torch.float32,
                                             device="meta"), torch.empty((N,), dtype=torch.int32, device="meta"))

            cfg = moe_config(T, k, E, I, Dm, "meta", sms=H200_SMS, fp8=fp8)
            for launch in _launches(meta(T, Dm), meta(E, Dm), weight(E, 2 * I, Dm), weight(E, Dm, I), k, True,
                                    weight(2 * Is, Dm), weight(Dm, Is), meta(1, Dm), Is, cfg, meta(T, Dm)):
                out.append((f"{launch.kernel.fn.__name__.strip('_').removesuffix('_kernel')} {model} T={T}",
                            launch))
    return out


def default_kernel_resources(models: tuple[str, ...] = tuple(MODELS), fp8: bool = False) -> list[dict]:
    """One row per distinct compiled kernel: ``label`` (kernel, model, T; the first launch that compiles to it),
    ``launches`` (how many launches share it), ``regs``, ``stack`` (bytes), ``smem``, or ``error``."""
    rows, seen = [], {}
    for label, launch in _default_launches(models, fp8):
        spec = _specialise(launch)
        key = (launch.kernel.fn.__name__, *(json.dumps(sorted((str(k), str(v)) for k, v in d.items())) for d in spec))
        if key in seen:
            seen[key]["launches"] += 1
            continue
        try:
            row = dict(label=label, launches=1, **cubin_resources(_compile(launch.kernel, *spec)))
        except Exception as exc:  # noqa: BLE001 - reported in the row
            row = dict(label=label, launches=1, error=f"{type(exc).__name__}: {exc}"[:300])
        seen[key] = row
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--fp8", action="store_true", help="block-FP8 expert and shared weights")
    args = parser.parse_args(argv)
    for row in default_kernel_resources(tuple(args.models), args.fp8):
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
