from __future__ import annotations

import httpx
from fastapi import FastAPI
from opentelemetry.trace import SpanKind

from tests.fakes.otel_sink import SpanSink, stage_entries
from tokenpath import attributes as attr
from tokenpath.instrumentation.gateway import (
    GatewayInstrumentor,
    gateway_stage,
    mark_engine_handoff,
    trace_headers,
)
from tokenpath.stages import StageId

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/echo")
    async def echo() -> dict[str, object]:
        with gateway_stage(StageId.AUTH_RATELIMIT):
            pass
        mark_engine_handoff()
        return {"headers": trace_headers()}

    return app


def _call(app: FastAPI, headers: dict[str, str] | None = None) -> httpx.Response:
    import asyncio

    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post("/v1/echo", headers=headers or {})

    return asyncio.run(run())


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
