from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from opentelemetry.trace import SpanKind, StatusCode

from testkit.fakes.otel_sink import SpanSink, stage_entries
from tests.instrumentation.reference.support import run_async
from tokenpath import attributes as attr
from tokenpath.instrumentation.gateway import (
    GatewayInstrumentor,
    TokenpathGatewayMiddleware,
    engine_request_id,
    gateway_stage,
    mark_engine_handoff,
    trace_headers,
)
from tokenpath.instrumentation.request_ids import trace_of
from tokenpath.stages import StageId

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/echo")
    async def echo() -> dict[str, object]:
        with gateway_stage(StageId.AUTH_RATELIMIT):
            pass
        mark_engine_handoff()
        return {"headers": trace_headers(), "request_id": engine_request_id()}

    return app


def _call(app: FastAPI, headers: dict[str, str] | None = None) -> httpx.Response:

    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post("/v1/echo", headers=headers or {})

    return run_async(run)


def test_instrument_app_is_idempotent_and_uninstrument_removes_it() -> None:
    sink = SpanSink()
    app = _app()
    instrumentor = GatewayInstrumentor()
    instrumentor.instrument_app(app, tracer_provider=sink.provider)
    instrumentor.instrument_app(app, tracer_provider=sink.provider)
    assert GatewayInstrumentor.is_instrumented(app)
    assert _call(app).status_code == 200
    server_spans = [s for s in sink.spans() if s.kind is SpanKind.SERVER]
    assert len(server_spans) == 1
    stages = {stage for stage, _, _ in stage_entries(server_spans)}
    assert {StageId.API_GATEWAY, StageId.AUTH_RATELIMIT, StageId.RESPONSE_PATH,
            StageId.NIC_TX} <= stages
    instrumentor.uninstrument_app(app)
    instrumentor.uninstrument_app(app)
    sink.clear()
    assert _call(app).status_code == 200
    assert sink.spans() == ()


def test_incoming_traceparent_is_the_parent_and_is_passed_on() -> None:
    sink = SpanSink()
    app = _app()
    GatewayInstrumentor().instrument_app(app, tracer_provider=sink.provider)
    response = _call(app, {"traceparent": TRACEPARENT})
    (span,) = sink.spans()
    assert format(span.context.trace_id, "032x") == TRACEPARENT.split("-")[1]
    assert span.parent is not None and format(span.parent.span_id, "016x") == "b7ad6b7169203331"
    outgoing = response.json()["headers"]["traceparent"]
    assert outgoing.split("-")[1] == TRACEPARENT.split("-")[1]  # same trace for the engine
    assert outgoing.split("-")[2] == format(span.context.span_id, "016x")  # child of gateway
    attributes = span.attributes or {}
    assert attributes[attr.RESPONSE_BYTES] == len(response.content)
    assert attributes[attr.RESPONSE_CHUNKS] == 1
    assert attributes[attr.TTFT_SECONDS] > 0


def test_helpers_are_no_ops_outside_an_instrumented_request() -> None:
    with gateway_stage(StageId.ROUTER):
        pass
    mark_engine_handoff()
    assert trace_headers() == {}


def test_global_instrument_covers_apps_created_afterwards_and_is_idempotent() -> None:
    import fastapi

    sink = SpanSink()
    instrumentor = GatewayInstrumentor()
    original = fastapi.FastAPI
    instrumentor.instrument(tracer_provider=sink.provider)
    instrumentor.instrument(tracer_provider=sink.provider)
    try:
        app = fastapi.FastAPI()

        @app.post("/v1/echo")
        async def echo() -> dict[str, str]:
            return {}

        assert GatewayInstrumentor.is_instrumented(app)
        assert _call(app).status_code == 200
        assert len([s for s in sink.spans() if s.kind is SpanKind.SERVER]) == 1
    finally:
        instrumentor.uninstrument()
        instrumentor.uninstrument()
    assert fastapi.FastAPI is original
    assert not GatewayInstrumentor.is_instrumented(fastapi.FastAPI())


def _serve(sink: SpanSink, app: Any,
           headers: list[tuple[bytes, bytes]] | None = None) -> list[dict[str, object]]:
    """Runs the middleware around ``app`` on a raw ASGI scope; returns what reached the
    server's ``send``."""
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    middleware = TokenpathGatewayMiddleware(app, sink.provider)
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
             "headers": headers or []}
    run_async(lambda: middleware(scope, receive, send))
    return sent


def _drive(sink: SpanSink, messages: list[dict[str, object]],
           headers: list[tuple[bytes, bytes]] | None = None) -> list[dict[str, object]]:
    """:func:`_serve` with an app that sends ``messages``."""

    async def app(scope: object, receive: object, send: Any) -> None:
        for message in messages:
            await send(message)

    return _serve(sink, app, headers)


def test_a_trace_header_name_in_any_case_is_honoured() -> None:
    # ASGI servers lowercase header names; a middleware or adapter that does not must not
    # split the trace.
    sink = SpanSink()
    _drive(sink, [{"type": "http.response.start", "status": 200},
                  {"type": "http.response.body", "body": b"ok"}],
           headers=[(b"Content-Type", b"application/json"),
                    (b"Traceparent", TRACEPARENT.encode())])
    (span,) = sink.spans()
    assert format(span.context.trace_id, "032x") == TRACEPARENT.split("-")[1]


def test_a_stream_ending_in_an_empty_body_and_a_bodiless_response() -> None:
    sink = SpanSink()
    stream = [{"type": "http.response.start", "status": 200},
              {"type": "http.response.body", "body": b"data: a\n\n", "more_body": True},
              {"type": "http.response.body", "body": b"data: b\n\n", "more_body": True},
              {"type": "http.response.body", "body": b"", "more_body": False}]
    assert _drive(sink, stream) == stream  # every message passed on, unchanged
    no_content = [{"type": "http.response.start", "status": 204},
                  {"type": "http.response.body", "body": b""}]
    assert _drive(sink, no_content) == no_content
    streamed, empty = sink.spans()
    attributes = streamed.attributes or {}
    assert attributes[attr.RESPONSE_CHUNKS] == 2  # the empty closing body is not a chunk
    assert attributes[attr.RESPONSE_BYTES] == 18
    assert attributes[attr.TTFT_SECONDS] >= 0
    empty_attributes = empty.attributes or {}
    assert empty_attributes[attr.HTTP_RESPONSE_STATUS_CODE] == 204
    assert empty_attributes[attr.RESPONSE_CHUNKS] == 0
    assert attr.TTFT_SECONDS not in empty_attributes
    (response_path,) = [event for event in empty.events
                        if (event.attributes or {}).get(attr.STAGE) == StageId.RESPONSE_PATH]
    assert (response_path.attributes or {})[attr.STAGE_SECONDS] == 0.0
    assert empty.start_time is not None and response_path.timestamp >= empty.start_time


def test_a_stream_that_breaks_after_its_first_chunk_is_recorded_as_failed() -> None:
    sink = SpanSink()

    async def app(scope: object, receive: object, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200})
        await send({"type": "http.response.body", "body": b"data: a\n\n", "more_body": True})
        raise RuntimeError("engine died mid-stream")

    with pytest.raises(RuntimeError, match="mid-stream"):  # the app's error is the app's
        _serve(sink, app)
    (span,) = sink.spans()
    attributes = span.attributes or {}
    assert attributes[attr.STATUS] == "error"
    assert span.status.status_code is StatusCode.ERROR
    assert attributes[attr.HTTP_RESPONSE_STATUS_CODE] == 200  # what went on the wire
    assert attributes[attr.RESPONSE_CHUNKS] == 1


def test_the_engine_request_id_names_the_gateway_span() -> None:
    sink = SpanSink()
    app = _app()
    GatewayInstrumentor().instrument_app(app, tracer_provider=sink.provider)
    body = _call(app).json()
    (server,) = [s for s in sink.spans() if s.kind is SpanKind.SERVER]
    assert server.context is not None
    assert trace_of(body["request_id"]) == (server.context.trace_id, server.context.span_id)
    assert engine_request_id() is None  # outside a request


def test_response_path_ends_when_the_last_body_write_began() -> None:
    sink = SpanSink()
    marks: dict[str, int] = {}

    async def app(scope: object, receive: object, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200})
        await send({"type": "http.response.body", "body": b"data: a\n\n", "more_body": True})
        await asyncio.sleep(0.02)  # the last write begins well after the first
        marks["before_last"] = time.time_ns()
        await send({"type": "http.response.body", "body": b"data: b\n\n", "more_body": True})
        marks["after_last"] = time.time_ns()
        await asyncio.sleep(0.2)  # the request ends well after its last write
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    _serve(sink, app)
    (span,) = sink.spans()
    (response_path,) = [event for event in span.events
                        if (event.attributes or {}).get(attr.STAGE) == StageId.RESPONSE_PATH]
    assert span.end_time is not None
    assert marks["before_last"] <= response_path.timestamp <= span.end_time
    # not the end of the request: within the 0.2 s after the last write, well before it
    assert response_path.timestamp < marks["after_last"] + 100_000_000
