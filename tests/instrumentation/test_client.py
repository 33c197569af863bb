"""The client shim: what it measures never breaks the request it wraps."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request

from testkit.fakes.otel_sink import SpanSink
from tokenpath import attributes as attr
from tokenpath.instrumentation.client import InstrumentedClient
from tokenpath.instrumentation.safety import telemetry_errors
from tokenpath.stages import StageId


def _chat_app(seen: list[dict[str, Any]]) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        seen.append(json.loads(await request.body()))
        return {"choices": [{"message": {"content": "hi"}}], "usage": {}}

    return app


def _client(app: FastAPI, sink: SpanSink,
            tokenize: Any = None) -> InstrumentedClient:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
    return InstrumentedClient("http://t", tracer_provider=sink.provider, http_client=http,
                              tokenize=tokenize)


@pytest.mark.parametrize("messages", [
    # An assistant tool-call turn: content is null.
    [{"role": "user", "content": "what is the weather"},
     {"role": "assistant", "content": None, "tool_calls": []}],
    # Content as a list of parts, text and image.
    [{"role": "user", "content": [{"type": "text", "text": "describe this"},
                                  {"type": "image_url", "image_url": {"url": "x"}}]}],
])
def test_every_openai_message_shape_is_sent_and_its_text_tokenized(
        messages: list[dict[str, Any]]) -> None:
    sink = SpanSink()
    seen: list[dict[str, Any]] = []
    tokenized: list[str] = []

    def tokenize(text: str) -> Sequence[int]:
        tokenized.append(text)
        return [0] * len(text.split())

    telemetry_errors.reset()
    client = _client(_chat_app(seen), sink, tokenize)
    result = asyncio.run(client.chat_completion(messages, model="m", max_tokens=4,
                                                stream=False))
    assert result.status_code == 200
    assert seen[0]["messages"] == messages  # sent as given
    expected = [part for m in messages for part in (
        [m["content"]] if isinstance(m["content"], str) else
        [p["text"] for p in m["content"] or () if p.get("type") == "text"])]
    assert tokenized == expected
    assert telemetry_errors.total() == 0


def test_a_failing_tokenizer_is_counted_and_the_request_still_goes_out() -> None:
    sink = SpanSink()
    seen: list[dict[str, Any]] = []

    def broken(text: str) -> Sequence[int]:
        raise RuntimeError("tokenizer broken")

    telemetry_errors.reset()
    client = _client(_chat_app(seen), sink, broken)
    result = asyncio.run(client.chat_completion([{"role": "user", "content": "x"}],
                                                model="m", max_tokens=4, stream=False))
    assert result.status_code == 200 and len(seen) == 1
    assert telemetry_errors.by_place() == {"client.tokenize": 1}
    (span,) = sink.spans()  # the root span is still recorded, with its stages
    stages = {event.attributes[attr.STAGE] for event in span.events}
    assert StageId.CLIENT_TOKENIZE.value in stages
