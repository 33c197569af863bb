"""The OpenAI-compatible reference server: /v1/chat/completions and /v1/completions, with
streaming (SSE), API-key auth, a token-bucket rate limit and a router over engine replicas.

The app only calls the gateway shim's small helpers (:func:`gateway_stage`,
:func:`mark_engine_handoff`, :func:`trace_headers`); they do nothing when the app is not
instrumented, so the same app serves as the uninstrumented baseline of the benchmark.
Prompt text is tokenized here and never reaches telemetry.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field

from tokenpath import attributes as attr
from tokenpath.instrumentation.gateway import (
    annotate,
    gateway_stage,
    mark_engine_handoff,
    trace_headers,
)
from tokenpath.instrumentation.reference import SIMULATED_ENGINE_LABEL
from tokenpath.instrumentation.reference.engine import EngineOverloaded, SimulatedEngine
from tokenpath.instrumentation.reference.engine_metrics import engine_registry
from tokenpath.instrumentation.reference.gateway_parts import ApiKeyAuth, Router, TokenBucket
from tokenpath.instrumentation.reference.tokenizer import ToyTokenizer
from tokenpath.stages import StageId

DEFAULT_MAX_TOKENS = 64
MAX_MAX_TOKENS = 4096


class ChatMessage(BaseModel):
    role: str
    content: str


class ChatCompletionRequest(BaseModel):
    model: str | None = None
    messages: list[ChatMessage]
    max_tokens: int = Field(default=DEFAULT_MAX_TOKENS, ge=1, le=MAX_MAX_TOKENS)
    stream: bool = False


class CompletionRequest(BaseModel):
    model: str | None = None
    prompt: str
    max_tokens: int = Field(default=DEFAULT_MAX_TOKENS, ge=1, le=MAX_MAX_TOKENS)
    stream: bool = False


@dataclass(slots=True)
class ServingComponents:
    """Everything the reference app is made of, passed in at construction."""

    router: Router
    engines: list[SimulatedEngine]
    auth: ApiKeyAuth
    rate_limit: TokenBucket
    model: str
    tokenizer: ToyTokenizer
    # Tokens per streamed SSE event: 1 is a write (a packet) per token, as most servers
    # stream; N coalesces N tokens per write (the last-mile what-if, made real).
    stream_tokens_per_chunk: int = 1


def chat_template(messages: list[ChatMessage]) -> str:
    return "\n".join(f"<|{message.role}|> {message.content}" for message in messages)


def _error(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status,
                        headers=headers)


def create_app(parts: ServingComponents) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        for engine in parts.engines:
            await engine.shutdown()

    app = FastAPI(title=f"tokenpath reference server ({SIMULATED_ENGINE_LABEL})",
                  lifespan=lifespan)
    tokenizer = parts.tokenizer

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "engine": SIMULATED_ENGINE_LABEL}

    registry = engine_registry(parts.engines)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": parts.model, "object": "model",
                                            "owned_by": SIMULATED_ENGINE_LABEL}]}

    def admit(request: Request) -> Response | None:
        with gateway_stage(StageId.AUTH_RATELIMIT):
            if not parts.auth.check(request.headers.get("authorization")):
                return _error(401, "invalid API key", "authentication_error")
            if not parts.rate_limit.try_acquire():
                retry = max(1, round(parts.rate_limit.retry_after_seconds() + 0.5))
                return _error(429, "rate limit exceeded", "rate_limit_error",
                              {"Retry-After": str(retry)})
        return None

    async def serve(prompt: str, max_tokens: int, stream: bool, chat: bool) -> Response:
        prompt_ids = tokenizer.encode(prompt)
        annotate(attr.GEN_AI_REQUEST_MODEL, parts.model)
        annotate(attr.STREAMING, stream)
        with gateway_stage(StageId.ROUTER):
            index = parts.router.choose(prompt_ids)
            engine = parts.router.replicas[index]
        mark_engine_handoff()
        tokens = engine.generate(prompt_ids, max_tokens, trace_headers=trace_headers())
        try:
            first = await anext(tokens)
        except EngineOverloaded as exc:
            return _error(503, str(exc), "overloaded")
        except StopAsyncIteration:
            first = None
        completion_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        annotate(attr.GEN_AI_RESPONSE_ID, completion_id)  # joins a client traced apart
        created = int(time.time())
        if not stream:
            ids = [] if first is None else [first]
            ids.extend([token async for token in tokens])
            text = tokenizer.decode(ids)
            choice: dict[str, Any] = (
                {"index": 0, "message": {"role": "assistant", "content": text},
                 "finish_reason": "length"} if chat
                else {"index": 0, "text": text, "finish_reason": "length"}
            )
            return JSONResponse({
                "id": completion_id,
                "object": "chat.completion" if chat else "text_completion",
                "created": created, "model": parts.model, "choices": [choice],
                "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids),
                          "total_tokens": len(prompt_ids) + len(ids)},
            })

        per_chunk = max(1, parts.stream_tokens_per_chunk)

        def event(piece: str) -> bytes:
            delta: dict[str, Any] = (
                {"index": 0, "delta": {"content": piece}, "finish_reason": None} if chat
                else {"index": 0, "text": piece, "finish_reason": None}
            )
            return _sse({"id": completion_id,
                         "object": "chat.completion.chunk" if chat else "text_completion",
                         "created": created, "model": parts.model, "choices": [delta]})

        async def events() -> AsyncIterator[bytes]:
            count = 0
            pending = first
            pieces: list[str] = []
            try:
                while pending is not None:
                    count += 1
                    pieces.append(tokenizer.decode_token(pending))
                    if len(pieces) >= per_chunk:
                        yield event("".join(pieces))
                        pieces = []
                    pending = await anext(tokens, None)
                if pieces:
                    yield event("".join(pieces))
            finally:
                await tokens.aclose()  # a client that went away aborts its request
            final: dict[str, Any] = (
                {"index": 0, "delta": {}, "finish_reason": "length"} if chat
                else {"index": 0, "text": "", "finish_reason": "length"}
            )
            yield _sse({"id": completion_id,
                        "object": "chat.completion.chunk" if chat else "text_completion",
                        "created": created, "model": parts.model, "choices": [final],
                        "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": count,
                                  "total_tokens": len(prompt_ids) + count}})
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatCompletionRequest) -> Response:
        refused = admit(request)
        if refused is not None:
            return refused
        return await serve(chat_template(body.messages), body.max_tokens, body.stream, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest) -> Response:
        refused = admit(request)
        if refused is not None:
            return refused
        return await serve(body.prompt, body.max_tokens, body.stream, chat=False)

    return app


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode("utf-8") + b"\n\n"
