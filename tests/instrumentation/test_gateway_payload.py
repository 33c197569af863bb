"""The gateway shim reads, never content, the request's top-level model and the numbers of
the response's usage and vLLM's per-request metrics onto its server span."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from opentelemetry.trace import SpanKind

from testkit.fakes.otel_sink import SpanSink
from tests.instrumentation.reference.support import run_async
from tokenpath import attributes as attr
from tokenpath.instrumentation.gateway import GatewayInstrumentor, annotate
from tokenpath.instrumentation.gateway import Message as AsgiMessage

PROMPT = "SECRET-PROMPT"
COMPLETION = "SECRET-COMPLETION"
USAGE = {"prompt_tokens": 151, "total_tokens": 159, "completion_tokens": 8,
         "prompt_tokens_details": {"cached_tokens": 128}}
METRICS = {"time_to_first_token_ms": 12.5, "generation_time_ms": 80.0, "queue_time_ms": 0.5}


def _app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        if body.get("annotate"):
            annotate(attr.GEN_AI_REQUEST_MODEL, "the-apps-own")
            annotate(attr.GEN_AI_USAGE_INPUT_TOKENS, 1)
        if not body.get("stream"):
            return {"id": "chatcmpl-1", "choices": [{"message": {"content": COMPLETION}}],
                    "usage": USAGE, "metrics": METRICS}

        async def events() -> AsyncIterator[bytes]:
            yield b'data: {"choices":[{"delta":{"content":"' + COMPLETION.encode() + b'"}}]}\n\n'
            if body.get("stream_options", {}).get("include_usage"):
                final = {"choices": [], "usage": USAGE, "metrics": METRICS}
                yield b"data: " + json.dumps(final).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def _post(app: Any, body: dict[str, Any]) -> httpx.Response:
    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await client.post("/v1/chat/completions", json=body)

    return run_async(run)


def _span_attributes(sink: SpanSink) -> dict[str, Any]:
    (span,) = [s for s in sink.spans() if s.kind is SpanKind.SERVER]
    return dict(span.attributes or {})


def _instrumented() -> tuple[FastAPI, SpanSink]:
    sink = SpanSink()
    app = _app()
    GatewayInstrumentor().instrument_app(app, tracer_provider=sink.provider)
    return app, sink


def _request(**extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": PROMPT}], "model": "tiny-llama", **extra}


def test_a_json_call_gives_the_model_usage_and_metrics_and_no_content() -> None:
    app, sink = _instrumented()
    assert _post(app, _request()).status_code == 200
    attributes = _span_attributes(sink)
    assert attributes[attr.GEN_AI_REQUEST_MODEL] == "tiny-llama"
    assert attributes[attr.GEN_AI_USAGE_INPUT_TOKENS] == 151
    assert attributes[attr.GEN_AI_USAGE_OUTPUT_TOKENS] == 8
    assert attributes[attr.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 128
    assert abs(attributes[attr.VLLM_LATENCY_TIME_IN_QUEUE] - 0.0005) < 1e-12
    assert abs(attributes[attr.VLLM_LATENCY_TIME_IN_MODEL_PREFILL] - 0.0125) < 1e-12
    assert abs(attributes[attr.VLLM_LATENCY_TIME_IN_MODEL_DECODE] - 0.08) < 1e-12
    text = repr(attributes)
    assert PROMPT not in text and COMPLETION not in text


def test_a_stream_gives_them_only_when_its_final_usage_chunk_came() -> None:
    app, sink = _instrumented()
    assert _post(app, _request(stream=True,
                               stream_options={"include_usage": True})).status_code == 200
    attributes = _span_attributes(sink)
    assert attributes[attr.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 128
    assert attributes[attr.GEN_AI_REQUEST_MODEL] == "tiny-llama"
    sink.clear()
    assert _post(app, _request(stream=True)).status_code == 200  # the client did not ask
    attributes = _span_attributes(sink)
    assert attr.GEN_AI_USAGE_INPUT_TOKENS not in attributes
    assert attributes[attr.GEN_AI_REQUEST_MODEL] == "tiny-llama"


def test_what_the_app_annotates_wins() -> None:
    app, sink = _instrumented()
    _post(app, _request(annotate=True))
    attributes = _span_attributes(sink)
    assert attributes[attr.GEN_AI_REQUEST_MODEL] == "the-apps-own"
    assert attributes[attr.GEN_AI_USAGE_INPUT_TOKENS] == 1
    assert attributes[attr.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 128


def _raw_call(body: bytes, response: bytes, chunk: int = 7) -> tuple[list[bytes], SpanSink]:
    """A plain ASGI app behind the shim: the request body in messages of ``chunk`` bytes,
    ``response`` as the reply; returns the body messages the app received."""
    from tokenpath.instrumentation.gateway import TokenpathGatewayMiddleware

    seen: list[bytes] = []

    async def raw_app(scope: Any, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            seen.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": response})

    sink = SpanSink()
    app = TokenpathGatewayMiddleware(raw_app, sink.provider)
    parts = [body[i:i + chunk] for i in range(0, len(body), chunk)] or [b""]

    async def run() -> None:
        messages = [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1}
                    for i, p in enumerate(parts)]

        async def receive() -> AsgiMessage:
            return messages.pop(0)

        async def send(message: AsgiMessage) -> None:
            return None

        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
                 "headers": []}
        await app(scope, receive, send)

    run_async(run)
    return seen, sink


def test_a_body_in_several_messages_is_read_once_whole_and_handed_on_unchanged() -> None:
    body = json.dumps(_request()).encode()
    seen, sink = _raw_call(body, json.dumps({"usage": USAGE}).encode())
    assert b"".join(seen) == body and len(seen) > 1
    attributes = _span_attributes(sink)
    assert attributes[attr.GEN_AI_REQUEST_MODEL] == "tiny-llama"
    assert attributes[attr.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] == 128


def test_bodies_that_are_not_what_is_expected_give_nothing_and_are_served() -> None:
    seen, sink = _raw_call(b"{not json", b'{"usage": {"prompt_tokens": 5', chunk=100)
    assert seen == [b"{not json"]
    attributes = _span_attributes(sink)
    assert attr.GEN_AI_REQUEST_MODEL not in attributes
    assert attr.GEN_AI_USAGE_INPUT_TOKENS not in attributes
