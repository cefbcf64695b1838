"""The ``lumotree`` command line: one subcommand per module, imported only when it runs.

Each command module defines ``add_arguments(parser)`` and ``run(args) -> int``. An error the user's input causes
(a bad option value, file, prompt or checkpoint) ends the command with one line ``error: ...`` on stderr and exit
code 2; any other failure with one line and exit code 1. ``lumotree --debug COMMAND ...`` shows the traceback
instead.
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
    "serve": ("lumotree.server.cli", "an OpenAI-compatible HTTP server over the engine (completions, chat, streaming, "
                                     "metrics)"),
    "train": ("lumotree.training.cli", "train the organism (a small Qwen3.5 hybrid with its MTP head) or an MTP "
                                       "head for a frozen target"),
    "bench": ("lumotree.bench", "benchmarks: `lumotree bench e2e` (end-to-end decoding throughput), `lumotree bench "
                                "serve` (a server under multi-turn agent load)"),
}


class _Parser(argparse.ArgumentParser):
    """argparse with its errors as one line ``error: ...`` (exit code 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


#: the errors a user's input causes (exit code 2); anything else exits with 1
USAGE_ERRORS = (ValueError, TypeError, KeyError, FileNotFoundError, IsADirectoryError, NotADirectoryError,
                PermissionError, UnicodeDecodeError)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="lumotree", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        # add_help=False: `lumotree CMD --help` must reach the second parser, which knows the command's options
        command_parser = sub.add_parser(name, help=help_text, description=help_text, add_help=False)
        command_parser.set_defaults(_module=module_name)
        command_parser.set_defaults(_needs_arguments=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command_line = list(argv)  # as given: what --tensor-parallel runs again in each rank
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    parser = build_parser()
    # First pass: find the command, then let its module add its own arguments and parse again.
    known, _ = parser.parse_known_args(argv)
    if known.command is None:
        parser.print_help()
        return 2
    module_name, help_text = COMMANDS[known.command]
    module = importlib.import_module(module_name)
    command_parser = _Parser(prog=f"lumotree {known.command}", description=help_text)
    module.add_arguments(command_parser)
    args = command_parser.parse_args(argv[argv.index(known.command) + 1:])
    args.command_line = command_line
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        return 130
    except Exception as exc:  # one line, or the traceback with --debug
        if debug:
            raise
        usage = isinstance(exc, USAGE_ERRORS)
        text = (str(exc).strip().splitlines() or [""])[0]
        sys.stderr.write(f"error: {text if usage and text else f'{type(exc).__name__}: {text}'}"
                         f"{'' if usage else ' (lumotree --debug ... shows the traceback)'}\n")
        return 2 if usage else 1
