"""``lumotree serve``: an OpenAI-compatible HTTP server over the engine, and its load benchmark.

The server is a front end like the command line, so it lives beside it in ``lumotree/`` rather than in the runtime's
``optimized/`` packages: it builds its model and engine with ``lumotree generate``'s options and functions and checks
prompts the same way; what it adds is HTTP, admission and streaming around one
:class:`~lumotree.optimized.engine.Engine`.

Modules: :mod:`~lumotree.server.loop` (the thread that drives the engine; submitting, cancelling, admission, time
limits), :mod:`~lumotree.server.protocol` (OpenAI's request and response formats), :mod:`~lumotree.server.text`
(detokenization and stop strings), :mod:`~lumotree.server.metrics` (Prometheus), :mod:`~lumotree.server.app` (the
FastAPI application), :mod:`~lumotree.server.cli` (the command) and :mod:`~lumotree.server.loadgen` (``lumotree bench
serve``: multi-turn agent conversations against a server). The web packages are the ``serve`` extra; importing this
package imports none of them.
"""

__all__: list[str] = []
