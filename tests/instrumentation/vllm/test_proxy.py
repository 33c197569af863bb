"""The gateway stand-in: forwards with traceparent, streams through, traces only the API."""

from __future__ import annotations

import httpx
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tokenpath.instrumentation.request_ids import REQUEST_ID_HEADER, trace_of
from tokenpath.instrumentation.vllm.proxy import build_proxy_app

SSE_BODY = b'data: {"choices": []}\n\ndata: [DONE]\n\n'


def test_forwards_traceparent_of_its_server_span_and_relays_stream() -> None:
    seen: list[httpx.Request] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=SSE_BODY,
                              headers={"content-type": "text/event-stream"})

    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    client = httpx.AsyncClient(transport=httpx.MockTransport(upstream),
                               base_url="http://vllm.invalid")
    app = build_proxy_app("http://vllm.invalid", provider, client=client)
    with TestClient(app) as gateway:
        reply = gateway.post("/v1/completions", json={"prompt": "x", "stream": True})
        assert gateway.get("/health").status_code == 200

    assert reply.status_code == 200
    assert reply.content == SSE_BODY
    (forwarded,) = seen
    assert forwarded.url.path == "/v1/completions"
    assert forwarded.content == b'{"prompt":"x","stream":true}'
    (server,) = [s for s in spans.get_finished_spans() if s.kind is SpanKind.SERVER]
    assert server.context is not None
    trace_id = forwarded.headers["traceparent"].split("-")[1]
    assert trace_id == format(server.context.trace_id, "032x")
    # vLLM's request id will name the trace, for the plugin's annotation span.
    assert trace_of(forwarded.headers[REQUEST_ID_HEADER]) == (server.context.trace_id,
                                                              server.context.span_id)
