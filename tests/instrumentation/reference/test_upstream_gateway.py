"""The reference gateway in front of a remote OpenAI-compatible engine (a fake upstream)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from testkit.fakes.otel_sink import SpanSink, stage_entries
from tests.instrumentation.reference.support import run_async
from tokenpath import attributes as attr
from tokenpath.instrumentation.client import InstrumentedClient
from tokenpath.instrumentation.gateway import GatewayInstrumentor
from tokenpath.instrumentation.reference.gateway_parts import ApiKeyAuth, TokenBucket
from tokenpath.instrumentation.reference.serving_path import LoopbackServer
from tokenpath.instrumentation.reference.upstream_gateway import (
    UpstreamGatewayParts,
    create_upstream_gateway,
)
from tokenpath.stages import StageId


def _fake_engine(seen: list[str]) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> StreamingResponse:
        seen.append(request.headers.get("traceparent", ""))

        async def events() -> AsyncIterator[bytes]:
            for word in ("hello", "world"):
                yield (b'data: {"choices":[{"index":0,"delta":{"content":" ' + word.encode()
                       + b'"}}]}\n\n')
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def test_forwards_with_the_gateway_trace_and_records_the_gateway_stages() -> None:
    sink = SpanSink()
    seen: list[str] = []
    upstream = LoopbackServer(_fake_engine(seen))
    upstream.start()
    gateway_app = create_upstream_gateway(UpstreamGatewayParts(
        [upstream.base_url], ApiKeyAuth(), TokenBucket(), "fake-model"))
    GatewayInstrumentor().instrument_app(gateway_app, tracer_provider=sink.provider)
    gateway = LoopbackServer(gateway_app)
    gateway.start()

    async def run() -> str:
        client = InstrumentedClient(gateway.base_url, tracer_provider=sink.provider)
        try:
            result = await client.chat_completion([{"role": "user", "content": "hi"}],
                                                  "fake-model", 4)
            assert result.status_code == 200 and result.text == " hello world"
            assert result.trace_id is not None
            return result.trace_id
        finally:
            await client.aclose()

    try:
        trace_id = run_async(run)
    finally:
        gateway.shutdown()
        upstream.shutdown()
    (traceparent,) = seen
    assert traceparent.split("-")[1] == trace_id  # the engine joins the gateway's trace
    server = next(s for s in sink.spans() if s.name.startswith("POST"))
    stages = {stage for stage, _, _ in stage_entries([server])}
    assert {StageId.API_GATEWAY, StageId.AUTH_RATELIMIT, StageId.ROUTER,
            StageId.RESPONSE_PATH, StageId.NIC_TX} <= stages
    assert (server.attributes or {})[attr.RESPONSE_CHUNKS] >= 1
    assert format(server.context.span_id, "016x") == traceparent.split("-")[2]
