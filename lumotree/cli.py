"""The ``lumotree`` command line: one subcommand per module, imported only when it runs.

Each command module defines ``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help). Modules are imported lazily so `lumotree --help` stays fast and torch-free.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("lumotree.demo", "decode a prompt with tree speculation on a small seeded hybrid model (GPU path "
                              "when CUDA is present)"),
    "prove": ("lumotree.proofs.cli", "run the sympy / Z3 / exact checks of the reference and print a table"),
    "expressivity": ("lumotree.expressivity.cli",
                     "parity-conditioned retrieval: constructions, proofs, bounds, training"),
    "generate": ("lumotree.generate", "decode prompts with the engine (autoregressive / chain / tree speculation)"),
    "bench": ("lumotree.optimized.engine.e2e", "benchmarks: `lumotree bench e2e` (end-to-end decoding throughput)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lumotree", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        # add_help=False: `lumotree CMD --help` must reach the second parser, which knows the command's options
        command_parser = sub.add_parser(name, help=help_text, description=help_text, add_help=False)
        command_parser.set_defaults(_module=module_name)
        command_parser.set_defaults(_needs_arguments=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # First pass: find the command, then let its module add its own arguments and parse again.
    known, _ = parser.parse_known_args(argv)
    if known.command is None:
        parser.print_help()
        return 2
    module_name, help_text = COMMANDS[known.command]
    module = importlib.import_module(module_name)
    command_parser = argparse.ArgumentParser(prog=f"lumotree {known.command}", description=help_text)
    module.add_arguments(command_parser)
    args = command_parser.parse_args(argv[1:])
    return int(module.run(args) or 0)
