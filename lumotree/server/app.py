"""The HTTP application (FastAPI on uvicorn): OpenAI's ``/v1/completions`` and ``/v1/chat/completions`` (whole or
streamed as server-sent events), ``/v1/models``, ``/health`` and Prometheus ``/metrics``.

A handler checks the request (:mod:`~lumotree.server.protocol`), submits it to the engine loop
(:class:`~lumotree.server.loop.EngineLoop`), and reads its token events from its own queue. A streamed response starts
(status 200) once the first token is there, so a request refused or timed out before it ran still gets its error
status. A client that goes away (a closed stream, a dropped connection while waiting), a stop string, or a handler
cancelled by the server's shutdown cancels the request, which frees its slot before the next step; a streamed
response cancels its request however it ends (:class:`EventStream`).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException

from .loop import EngineFailure, EngineLoop, QueueFull, ShuttingDown, Ticket
from .metrics import ServerMetrics
from .protocol import (
    FINISH_REASONS,
    APIError,
    GenerationRequest,
    ServedModel,
    chunk_body,
    parse_request,
    response_body,
    usage_body,
)
from .text import OutputText

__all__ = ["create_app", "EventStream", "RETRY_AFTER_S", "DISCONNECT_POLL_S"]

#: the ``Retry-After`` of a 503 (seconds)
RETRY_AFTER_S = 1
#: how often a handler waiting for tokens checks that its client is still there (seconds)
DISCONNECT_POLL_S = 0.25


class ClientGone(Exception):
    """The client closed its connection."""


def _unavailable(message: str, code: str) -> APIError:
    return APIError(503, message, None, code, "server_unavailable", {"Retry-After": str(RETRY_AFTER_S)})


def create_app(engine: Any, served: ServedModel, max_waiting: int = 64, request_timeout: float | None = None
               ) -> FastAPI:
    """The application serving ``engine`` as ``served``; its lifespan starts and stops the engine loop
    (``app.state.loop``). ``request_timeout``: seconds a request may take in all (None: no limit)."""
    metrics = ServerMetrics()
    loop = EngineLoop(engine, max_waiting, metrics)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        loop.start()
        yield
        await asyncio.to_thread(loop.stop)

    app = FastAPI(title="lumotree", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.loop, app.state.served, app.state.metrics = loop, served, metrics

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body(), exc.status, headers=exc.headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return JSONResponse(APIError(exc.status_code, message, code="not_found" if exc.status_code == 404 else None)
                            .body(), exc.status_code)

    @app.exception_handler(Exception)
    async def server_error(_: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(APIError(500, f"internal error: {type(exc).__name__}: {exc}", kind="server_error")
                            .body(), 500)

    @app.get("/health")
    async def health() -> JSONResponse:
        counts = loop.counts
        if loop.draining:
            return JSONResponse({"status": "draining", **counts}, 503)
        return JSONResponse({"status": "ok", **counts})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    def model_card() -> dict[str, Any]:
        return {"id": served.name, "object": "model", "created": served.created, "owned_by": "lumotree",
                "max_model_len": served.max_seq_len}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> dict[str, Any]:
        if name != served.name:
            raise APIError(404, f"The model {name!r} does not exist; this server serves {served.name!r}", "model",
                           "model_not_found")
        return model_card()

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await generate(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    async def generate(request: Request, chat: bool) -> Response:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise APIError(400, f"the request body is not valid JSON ({exc})", code="invalid_json") from None
        spec = parse_request(body, served, chat)
        try:
            ticket = loop.submit(spec.prompt, spec.params, request_timeout)
        except QueueFull as exc:
            raise _unavailable(str(exc), "queue_full") from None
        except ShuttingDown as exc:
            raise _unavailable(str(exc), "shutting_down") from None
        reply = Reply(loop, ticket, spec, served, request)
        streaming = False
        try:
            first = await reply.next_event()
            reply.check_started(first)
            if spec.stream:
                streaming = True
                return EventStream(reply.stream(first), on_close=lambda: loop.cancel(ticket))
            return JSONResponse(await reply.whole(first))
        except ClientGone:
            return Response(status_code=499)
        finally:
            if not streaming:
                loop.cancel(ticket)  # no-op once finished; frees the slot of a client gone or a failed handler

    return app


class EventStream(StreamingResponse):
    """Server-sent events that cancel their request however the response ends: sent whole, the client gone, the
    task cancelled, or never started."""

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None]):
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self.on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


class Reply:
    """One request's answer: its events turned into text, whole or streamed."""

    def __init__(self, loop: EngineLoop, ticket: Ticket, spec: GenerationRequest, served: ServedModel,
                 request: Request):
        self.loop, self.ticket, self.spec, self.served, self.request = loop, ticket, spec, served, request
        self.output = OutputText(served.decode, spec.stop)
        self.id = ("chatcmpl-" if spec.chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    async def next_event(self) -> Any:
        """The ticket's next event; raises :class:`ClientGone` when the client has left meanwhile."""
        while True:
            try:
                return await asyncio.wait_for(self.ticket.events.get(), DISCONNECT_POLL_S)
            except asyncio.TimeoutError:
                if await self.request.is_disconnected():
                    raise ClientGone from None

    def check_started(self, event: Any) -> None:
        """The first event: an error status when the request ended before its first token."""
        if isinstance(event, EngineFailure):
            raise APIError(500, event.message, kind="server_error")
        if event.finished and not event.tokens and self.ticket.emitted == 0:
            if event.finish_reason == "timeout":
                raise _unavailable("the request timed out waiting for a slot (--request-timeout)", "timeout")
            raise _unavailable("the server is shutting down", "shutting_down")

    def take(self, event: Any) -> tuple[str, str | None]:
        """New text of ``event`` and, when the output ends with it, OpenAI's finish reason."""
        if isinstance(event, EngineFailure):
            raise APIError(500, event.message, kind="server_error")
        if event.finished and event.finish_reason == "abort":
            raise _unavailable("the server is shutting down: the request was cancelled", "shutting_down")
        text = self.output.add(event.tokens, final=event.finished, drop_last=event.finish_reason == "stop")
        if self.output.stopped:
            self.loop.cancel(self.ticket, "stop")
            return text, "stop"
        return text, FINISH_REASONS[event.finish_reason] if event.finished else None

    def usage(self) -> dict[str, int]:
        return usage_body(len(self.spec.prompt), len(self.output.tokens))

    async def whole(self, event: Any) -> dict[str, Any]:
        while True:
            _, reason = self.take(event)
            if reason is not None:
                return response_body(self.id, self.created, self.served.name, self.spec.chat, self.output.text,
                                     reason, self.usage())
            event = await self.next_event()

    def sse(self, text: str | None = None, reason: str | None = None, first: bool = False,
            usage: dict[str, int] | None = None) -> str:
        body = chunk_body(self.id, self.created, self.served.name, self.spec.chat, text, reason, first, usage)
        return f"data: {json.dumps(body)}\n\n"

    async def stream(self, event: Any) -> AsyncIterator[str]:
        """Server-sent events: a chunk per new text, the finish reason, the usage if asked, then ``[DONE]``."""
        first = True
        try:
            while True:
                try:
                    text, reason = self.take(event)
                except APIError as exc:  # the status is sent already: the error travels as an event
                    yield f"data: {json.dumps(exc.body())}\n\n"
                    break
                if text or (first and self.spec.chat):
                    yield self.sse(text, first=first)
                    first = False
                if reason is not None:
                    yield self.sse(None if self.spec.chat else "", reason)
                    if self.spec.include_usage:
                        yield self.sse(usage=self.usage())
                    break
                event = await self.next_event()
            yield "data: [DONE]\n\n"
        except ClientGone:
            pass
