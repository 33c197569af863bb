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


VLLM_REPLY = (b'{"id":"chatcmpl-1","choices":[{"message":{"content":"SECRET"}}],'
              b'"usage":{"prompt_tokens":151,"total_tokens":159,"completion_tokens":8,'
              b'"prompt_tokens_details":{"cached_tokens":128}},'
              b'"metrics":{"time_to_first_token_ms":12.5,"generation_time_ms":80.0,'
              b'"queue_time_ms":0.5}}')


def _proxied(plain: bool, reply: bytes = VLLM_REPLY) -> tuple[httpx.Request, dict[str, object]]:
    seen: list[httpx.Request] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=reply, headers={"content-type": "application/json"})

    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    client = httpx.AsyncClient(transport=httpx.MockTransport(upstream),
                               base_url="http://vllm.invalid")
    app = build_proxy_app("http://vllm.invalid", provider, client=client, plain=plain)
    with TestClient(app) as gateway:
        answer = gateway.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "SECRET"}], "model": "tiny-llama"})
    assert answer.status_code == 200 and answer.content == reply
    (server,) = [s for s in spans.get_finished_spans() if s.kind is SpanKind.SERVER]
    return seen[0], dict(server.attributes or {})


def test_its_server_span_names_the_model_and_vllms_usage_and_metrics() -> None:
    from tokenpath import attributes as attr

    forwarded, attributes = _proxied(plain=False)
    assert attributes[attr.GEN_AI_REQUEST_MODEL] == "tiny-llama"
    assert attributes[attr.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 128
    assert attributes[attr.GEN_AI_USAGE_INPUT_TOKENS] == 151
    assert abs(float(attributes[attr.VLLM_LATENCY_TIME_IN_QUEUE]) - 0.0005) < 1e-12  # type: ignore[arg-type]
    assert "SECRET" not in repr(attributes)
    assert REQUEST_ID_HEADER in forwarded.headers


def test_plain_is_stock_instrumentation_only() -> None:
    from tokenpath import attributes as attr

    forwarded, attributes = _proxied(plain=True)
    assert "traceparent" in forwarded.headers and REQUEST_ID_HEADER not in forwarded.headers
    assert not any(k.startswith("gen_ai.") for k in attributes), attributes
    assert attr.GEN_AI_REQUEST_MODEL not in attributes
