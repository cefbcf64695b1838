"""``lumotree serve``: an OpenAI-compatible HTTP server over the engine (autoregressive, chain or tree speculation).

The model, backend and speculation options are ``lumotree generate``'s (the same definitions, checks, model and engine
construction); the server's own: ``--host``, ``--port`` (0: any free port; the address is printed on stderr),
``--served-model-name``, ``--max-waiting`` (requests waiting for a slot before new ones get HTTP 503),
``--request-timeout`` and ``--shutdown-timeout``. SIGINT / SIGTERM stop taking requests, let the running ones finish
for up to ``--shutdown-timeout`` seconds, cancel the rest between two engine steps, and exit.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
import time
from typing import Any

from lumotree.errors import UsageError
from lumotree.parallel import check_parallel_arguments, launch_ranks
from lumotree.generate import (
    add_model_arguments,
    add_speculation_arguments,
    build_engine,
    build_model,
    check_model_arguments,
    choose_backend,
)

__all__ = ["add_arguments", "run", "check_server_arguments", "eos_token_ids"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    add_model_arguments(parser)
    add_speculation_arguments(parser)
    srv = parser.add_argument_group("server")
    srv.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    srv.add_argument("--port", type=int, default=8000, help="port to listen on (0: any free port)")
    srv.add_argument("--served-model-name", help="the model's name in the API; unset: the checkpoint folder's name, "
                                                 "or random-SIZE")
    srv.add_argument("--max-waiting", type=int, default=64,
                     help="requests that may wait for a slot; past them new requests get HTTP 503 with Retry-After")
    srv.add_argument("--request-timeout", type=float, default=600.0,
                     help="seconds a request may take in all (0: no limit); one that runs out ends with "
                          "finish_reason length, or HTTP 503 if it never got a slot")
    srv.add_argument("--shutdown-timeout", type=float, default=30.0,
                     help="on SIGINT / SIGTERM, seconds running requests get to finish before they are cancelled")
    srv.add_argument("--log-level", choices=("critical", "error", "warning", "info", "debug"), default="info",
                     help="uvicorn's log level")


def check_server_arguments(args: argparse.Namespace) -> None:
    """The values of the server options, before anything is loaded."""
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port = {args.port}: must lie in [0, 65535]")
    if args.max_waiting < 0:
        raise UsageError(f"--max-waiting = {args.max_waiting}: must be >= 0")
    for option in ("request_timeout", "shutdown_timeout"):
        value = getattr(args, option)
        if not (math.isfinite(value) and value >= 0):
            raise UsageError(f"--{option.replace('_', '-')} = {value}: must be a finite number of seconds >= 0")
    if args.served_model_name is not None and not args.served_model_name.strip():
        raise UsageError("--served-model-name: must not be empty")


def eos_token_ids(model_dir: str | None, tokenizer: Any) -> tuple[int, ...]:
    """The tokens that end a generation unless a request sets ``ignore_eos``: the tokenizer's end-of-sequence token
    and the checkpoint's ``generation_config.json`` ``eos_token_id`` (one id or a list)."""
    ids = [getattr(tokenizer, "eos_token_id", None)]
    path = os.path.join(model_dir, "generation_config.json") if model_dir else ""
    if path and os.path.isfile(path):
        try:
            with open(path) as f:
                value = json.load(f).get("eos_token_id")
        except (json.JSONDecodeError, AttributeError) as exc:
            raise UsageError(f"{path}: not a generation config ({exc})") from None
        ids += value if isinstance(value, list) else [value]
    return tuple(dict.fromkeys(int(i) for i in ids if isinstance(i, int) and not isinstance(i, bool)))


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket, opened before the model is loaded so that a taken port fails at once."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)  # connections wait in the backlog until the server accepts them
    except OSError as exc:
        raise UsageError(f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc})") from None
    sock.set_inheritable(True)
    return sock


def run(args: argparse.Namespace) -> int:
    check_model_arguments(args)
    check_server_arguments(args)
    backend = choose_backend(args)
    check_parallel_arguments(args, backend)
    try:
        import uvicorn

        from .app import create_app
    except ImportError as exc:
        raise UsageError(f"lumotree serve needs the serve extra (pip install 'lumotree[serve]'): {exc}") from None
    from .follow import LeaderEngine, follow
    from .protocol import ServedModel

    code = launch_ranks(args)
    if code is not None:  # --tensor-parallel: this process started the ranks
        return code
    lead = os.environ.get("RANK", "0") == "0"
    sock = _listen(args.host, args.port) if lead else None
    target, draft, tokenizer, _ = build_model(args, backend)
    engine = build_engine(args, target, draft, sampling=True)
    if engine.parallel.active:  # rank 0 serves; the others replay its engine calls
        if not lead:
            follow(engine)
            return 0
        engine = LeaderEngine(engine)
    name = args.served_model_name or (os.path.basename(os.path.normpath(args.model)) if args.model
                                      else f"random-{args.random}")
    served = ServedModel(name, tokenizer, engine.model.vocab_size, engine.model.max_seq_len, int(time.time()),
                         eos_token_ids(args.model, tokenizer))
    app = create_app(engine, served, args.max_waiting, args.request_timeout or None)
    host, port = sock.getsockname()[:2]
    banner = (f"lumotree serve: {name!r} on http://{host}:{port} (spec={args.spec}, drafter="
              f"{engine.drafter.name if engine.drafter else '-'}, budget={args.budget}, slots="
              f"{engine.model.num_slots}, context={engine.model.max_seq_len}, device="
              f"{getattr(target, 'device', 'cpu')})\n")
    loop = app.state.loop

    class DrainingServer(uvicorn.Server):
        """uvicorn's server that announces its address once it takes requests (its signal handlers in place), and
        whose first SIGINT / SIGTERM also makes the engine loop refuse new requests."""

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if not self.should_exit:  # started
                sys.stderr.write(banner)
                sys.stderr.flush()

        def handle_exit(self, sig: int, frame: Any) -> None:
            loop.drain()
            super().handle_exit(sig, frame)

    server = DrainingServer(uvicorn.Config(app, log_level=args.log_level, access_log=args.log_level == "debug",
                                           timeout_graceful_shutdown=args.shutdown_timeout))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn raises the SIGINT it handled again once shut down: the shutdown was clean
        pass
    finally:
        if isinstance(engine, LeaderEngine):
            engine.close()
    return 0
