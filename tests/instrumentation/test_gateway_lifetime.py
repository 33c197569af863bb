"""A finished request's telemetry is freed when the request ends, not kept alive by the
server: served by a real uvicorn over a kept-alive connection, with spans exported by
the SDK's processor to memory and by tokenpath's processor and OTLP/HTTP exporter.

uvicorn schedules the connection's keep-alive timeout inside the send of a response's
last message; a callback keeps a copy of the context it was scheduled in, so the shim
sends that message outside the request's context (``_TracedSend._last``). The keep-alive
timeout here is long (two minutes), so a request still held by the timer would still be
alive when the wait below gives up.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import threading
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from opentelemetry.sdk.trace import TracerProvider
from starlette.background import BackgroundTask

from testkit.fakes.otel_sink import SpanSink
from testkit.fakes.otlp_http import OtlpHttpReceiver
from tokenpath.instrumentation.gateway import (
    ASGIApp,
    GatewayInstrumentor,
    GatewayRequest,
    Message,
    Receive,
    Scope,
    Send,
    current_request,
    gateway_stage,
    mark_engine_handoff,
    trace_headers,
)
from tokenpath.instrumentation.otlp_exporter import (
    TokenpathBatchSpanProcessor,
    TokenpathOTLPSpanExporter,
)
from tokenpath.instrumentation.reference.engine import EngineConfig, SimulatedEngine
from tokenpath.stages import StageId

KEEP_ALIVE_SECONDS = 120
WAIT_SECONDS = 20.0


def _app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/stream")
    async def stream() -> StreamingResponse:
        with gateway_stage(StageId.ROUTER):
            pass
        mark_engine_handoff()

        async def chunks() -> AsyncIterator[bytes]:
            for piece in (b"data: a\n\n", b"data: b\n\n", b"data: [DONE]\n\n"):
                yield piece

        return StreamingResponse(chunks(), media_type="text/event-stream")

    @app.post("/v1/json")
    async def json_body() -> dict[str, str]:
        mark_engine_handoff()
        return {"status": "ok"}

    return app


class _Server:
    """uvicorn serving the app in a thread, with a long keep-alive timeout."""

    def __init__(self, app: ASGIApp) -> None:
        self.server = uvicorn.Server(uvicorn.Config(
            app, host="127.0.0.1", port=0, log_level="warning", access_log=False,
            lifespan="off", timeout_keep_alive=KEEP_ALIVE_SECONDS))
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()),
                                       daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + WAIT_SECONDS
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "no server"
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc_info: object) -> None:
        self.server.should_exit = True
        self.thread.join(WAIT_SECONDS)


def _live_requests() -> int:
    gc.collect()  # cycles aside: what stays is held by something live
    return sum(1 for obj in gc.get_objects() if type(obj) is GatewayRequest)


def _wait_until_freed() -> int:
    deadline = time.monotonic() + WAIT_SECONDS
    while (live := _live_requests()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return live


@pytest.fixture(params=["in_memory", "tokenpath_exporter"])
def provider(request: pytest.FixtureRequest) -> Iterator[TracerProvider]:
    if request.param == "in_memory":
        sink = SpanSink()
        yield sink.provider
        sink.shutdown()
        return
    receiver = OtlpHttpReceiver()
    exporting = TracerProvider(shutdown_on_exit=False)
    exporting.add_span_processor(TokenpathBatchSpanProcessor(
        TokenpathOTLPSpanExporter(endpoint=receiver.url)))
    yield exporting
    assert exporting.force_flush()
    assert receiver.bodies  # the spans went out
    exporting.shutdown()
    receiver.close()


@pytest.mark.parametrize("path", ["/v1/stream", "/v1/json"])
def test_a_finished_request_is_freed_while_its_connection_is_kept_alive(
        provider: TracerProvider, path: str) -> None:
    app = _app()
    GatewayInstrumentor().instrument_app(app, tracer_provider=provider)
    with _Server(app) as url, httpx.Client(base_url=url) as client:
        for _ in range(3):  # on one kept-alive connection
            response = client.post(path)
            assert response.status_code == 200
        assert _wait_until_freed() == 0
        assert client.post(path).status_code == 200  # the connection is still kept alive


def test_the_reference_engine_loop_keeps_no_request_context() -> None:
    """The step loop serves every request: the request that starts it does not lend it
    its context (which would keep that request's span for the engine's lifetime)."""
    var: contextvars.ContextVar[str] = contextvars.ContextVar("request")
    seen_by_the_loop: list[str | None] = []

    async def run() -> list[int]:
        engine = SimulatedEngine(EngineConfig(time_scale=1e-6))
        step = engine._step

        async def observed_step() -> None:
            seen_by_the_loop.append(var.get(None))
            await step()

        engine._step = observed_step  # type: ignore[method-assign]
        try:
            var.set("the first request")  # the request that starts the step loop
            return [token async for token in engine.generate([1, 2, 3], 2)]
        finally:
            await engine.shutdown()

    assert len(asyncio.run(run())) == 2
    assert seen_by_the_loop and set(seen_by_the_loop) == {None}


def test_the_last_message_is_sent_outside_the_request_and_the_request_goes_on() -> None:
    """The server's send of the last message runs outside the request; the app's code
    after it (a background task, run once the response is sent) still runs inside."""
    seen: dict[str, object] = {}
    app = FastAPI()

    def after_the_response() -> None:
        seen["background"] = current_request()
        seen["background_headers"] = trace_headers()

    @app.post("/v1/json")
    async def json_body() -> JSONResponse:
        return JSONResponse({"status": "ok"}, background=BackgroundTask(after_the_response))

    sink = SpanSink()
    GatewayInstrumentor().instrument_app(app, tracer_provider=sink.provider)

    async def server_side(scope: Scope, receive: Receive, send: Send) -> None:
        async def server_send(message: Message) -> None:  # what the server's send sees
            if message["type"] == "http.response.body" and not message.get("more_body"):
                seen["last_send"] = current_request()
            await send(message)

        await app(scope, receive, server_send)

    with _Server(server_side) as url, httpx.Client(base_url=url) as client:
        assert client.post("/v1/json").status_code == 200
    assert seen["last_send"] is None
    assert isinstance(seen["background"], GatewayRequest)
    (span,) = sink.spans()
    assert span.context is not None
    assert format(span.context.trace_id, "032x") in str(seen["background_headers"])
