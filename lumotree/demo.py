"""``lumotree demo``: picks the path and says which one it took.

- CPU path: :mod:`lumotree.reference.demo` (the exact float64 reference, unchanged);
- GPU path: :mod:`lumotree.optimized.engine.demo` (the same seeded model and drafter through the optimized engine).

``--path auto`` (default) takes the GPU path when ``torch.cuda.is_available()`` and the options are ones the engine runs
(``--sampling greedy`` or ``deterministic``), else the CPU path. This module sits outside both layers so that the
reference never imports the optimized runtime (or triton); the GPU path is imported only when taken.
"""

from __future__ import annotations

import argparse

from lumotree.reference import demo as reference_demo

__all__ = ["add_arguments", "run", "choose_path", "PATHS", "ENGINE_SAMPLING"]

PATHS = ("auto", "cpu", "gpu")
#: ``--sampling`` values the GPU path runs: the engine's drafters propose deterministically (top-k trees, prompt lookup)
ENGINE_SAMPLING = ("greedy", "deterministic")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    reference_demo.add_arguments(parser)
    parser.epilog += (
        " With a CUDA GPU the demo runs the same model through the optimized engine (Triton kernels, bfloat16, CUDA "
        "graphs) and compares it with autoregressive decoding of that engine; --path cpu keeps the reference."
    )
    path = parser.add_argument_group("path")
    path.add_argument("--path", choices=PATHS, default="auto",
                      help="auto: the GPU path when CUDA is available (and --sampling is greedy or deterministic), "
                           "else the CPU reference; cpu: the float64 reference; gpu: the optimized engine (needs CUDA)")
    path.add_argument("--dtype", choices=("bfloat16", "float32"), default=None,
                      help="GPU path only: the engine's dtype (default bfloat16; float32 makes the greedy check exact)")


def choose_path(args: argparse.Namespace) -> tuple[str, str]:
    """``("cpu" | "gpu", reason)`` for ``args.path``; raises ``ValueError`` when ``--path gpu`` cannot run."""
    if args.path == "cpu":
        return "cpu", "--path cpu"
    import torch

    cuda = torch.cuda.is_available()
    if args.path == "gpu":
        if not cuda:
            raise ValueError("--path gpu needs a CUDA GPU, but torch.cuda.is_available() is False "
                             "(use --path cpu or --path auto)")
        return "gpu", "--path gpu"
    if not cuda:
        return "cpu", "no CUDA GPU"
    if args.sampling not in ENGINE_SAMPLING:
        return "cpu", f"--sampling {args.sampling} draws sampled draft trees, which only the reference drafters do"
    return "gpu", "CUDA GPU present"


def run(args: argparse.Namespace) -> int:
    try:
        path, reason = choose_path(args)
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    if path == "gpu":
        from lumotree.optimized.engine.demo import run_engine

        return run_engine(args)
    print(f"path: CPU reference (float64) ({reason})")
    if args.dtype is not None:
        print(f"note: --dtype {args.dtype} applies to the GPU path only; the reference computes in float64")
    return reference_demo.run(args)
