"""Client wrapper for OpenAI-compatible HTTP APIs (httpx).

:class:`InstrumentedClient` opens the request's root span (``tokenpath.request``, kind
CLIENT), records ``client_tokenize`` (counting the prompt's tokens and encoding the body)
and ``client_decode`` (parsing the response and detokenizing, summed over chunks) as
``STAGE_EVENT`` events, and sends ``traceparent`` so gateway and engine spans join the
same trace. Messages are never put on the span. Telemetry failures are counted, never
raised; HTTP errors are the caller's, as with any client.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tokenpath import attributes as attr
from tokenpath.instrumentation.engine_trace import get_tracer
from tokenpath.instrumentation.safety import telemetry_errors
from tokenpath.instrumentation.stage_recorder import StageRecorder
from tokenpath.stages import StageId

DEFAULT_TIMEOUT_SECONDS = 120.0
_PROPAGATOR = TraceContextTextMapPropagator()
_SSE_PREFIX = "data: "
_SSE_DONE = "[DONE]"


def _whitespace_token_count(text: str) -> list[int]:
    return [0] * len(text.split())


def _message_texts(content: Any) -> list[str]:
    """The text of one chat message's ``content``: a string, a list of content parts
    (only their ``text`` parts), or nothing (``None``, as assistant tool-call turns send)."""
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [part["text"] for part in content
                if isinstance(part, dict) and isinstance(part.get("text"), str)]
    return []


@dataclass(slots=True)
class ClientResult:
    status_code: int
    text: str
    chunks: int
    trace_id: str | None
    usage: dict[str, Any] | None = None


class InstrumentedClient:
    """An async OpenAI-compatible client whose requests are traced end to end."""

    def __init__(self, base_url: str, api_key: str | None = None,
                 tracer_provider: TracerProvider | None = None,
                 tokenize: Callable[[str], Sequence[int]] | None = None,
                 http_client: httpx.AsyncClient | None = None,
                 timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        self._tracer = get_tracer(tracer_provider)
        self._tokenize = tokenize or _whitespace_token_count
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient(base_url=base_url, timeout=timeout_seconds)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def chat_completion(self, messages: list[dict[str, Any]], model: str,
                              max_tokens: int, stream: bool = True,
                              api_key: str | None = None) -> ClientResult:
        """``api_key`` overrides the client's own for this request."""
        body = {"model": model, "messages": messages, "max_tokens": max_tokens,
                "stream": stream}
        prompt_texts = [text for m in messages for text in _message_texts(m.get("content"))]
        return await self._request("/v1/chat/completions", body, prompt_texts, model, chat=True,
                                   api_key=api_key)

    async def completion(self, prompt: str, model: str, max_tokens: int,
                         stream: bool = True) -> ClientResult:
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": stream}
        return await self._request("/v1/completions", body, [prompt], model, chat=False)

    async def _request(self, path: str, body: dict[str, Any], prompt_texts: list[str],
                       model: str, chat: bool, api_key: str | None = None) -> ClientResult:
        span = self._start_span(path, model, bool(body.get("stream")),
                                int(body.get("max_tokens", 0)))
        recorder = StageRecorder(span) if span is not None else None
        headers = dict(self._headers)
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        started = time.perf_counter()
        try:  # telemetry only: the token ids are not kept
            for text in prompt_texts:
                self._tokenize(text)
        except Exception as exc:
            telemetry_errors.count("client.tokenize", exc)
        payload = json.dumps(body).encode("utf-8")
        tokenize_seconds = time.perf_counter() - started
        tokenize_end_ns = time.time_ns()
        if span is not None:
            try:
                _PROPAGATOR.inject(headers, context=trace.set_span_in_context(span))
            except Exception as exc:
                telemetry_errors.count("client.inject", exc)
        decode_seconds = 0.0
        status_code = 0
        try:
            headers["Content-Type"] = "application/json"
            async with self._http.stream("POST", path, content=payload,
                                         headers=headers) as response:
                status_code = response.status_code
                if body.get("stream") and response.status_code == 200:
                    pieces: list[str] = []
                    usage: dict[str, Any] | None = None
                    chunks = 0
                    async for line in response.aiter_lines():
                        t0 = time.perf_counter()
                        if line.startswith(_SSE_PREFIX) and line[len(_SSE_PREFIX):] != _SSE_DONE:
                            event = json.loads(line[len(_SSE_PREFIX):])
                            chunks += 1
                            usage = event.get("usage") or usage
                            for choice in event.get("choices", ()):
                                piece = (choice.get("delta", {}).get("content")
                                         if chat else choice.get("text"))
                                if piece:
                                    pieces.append(piece)
                        decode_seconds += time.perf_counter() - t0
                    t0 = time.perf_counter()
                    text = "".join(pieces)
                    decode_seconds += time.perf_counter() - t0
                    return ClientResult(status_code, text, chunks, _trace_id(span), usage)
                raw = await response.aread()
                t0 = time.perf_counter()
                text, usage = "", None
                if response.status_code == 200:
                    data = json.loads(raw)
                    usage = data.get("usage")
                    choice = (data.get("choices") or [{}])[0]
                    text = (choice.get("message", {}).get("content", "") if chat
                            else choice.get("text", ""))
                decode_seconds += time.perf_counter() - t0
                return ClientResult(status_code, text, 1, _trace_id(span), usage)
        except BaseException:
            if span is not None:
                _safe_set_status(span, Status(StatusCode.ERROR))
            raise
        finally:
            if span is not None and recorder is not None:
                _finish_span(span, recorder, tokenize_seconds, tokenize_end_ns, decode_seconds,
                             status_code)

    def _start_span(self, path: str, model: str, stream: bool, max_tokens: int) -> Span | None:
        try:
            return self._tracer.start_span(
                attr.SPAN_REQUEST, kind=SpanKind.CLIENT,
                attributes={attr.GEN_AI_REQUEST_MODEL: model, attr.STREAMING: stream,
                            attr.GEN_AI_REQUEST_MAX_TOKENS: max_tokens, attr.URL_PATH: path,
                            attr.HTTP_REQUEST_METHOD: "POST"},
            )
        except Exception as exc:
            telemetry_errors.count("client.start", exc)
            return None


def _trace_id(span: Span | None) -> str | None:
    if span is None:
        return None
    try:
        context = span.get_span_context()
        return format(context.trace_id, "032x") if context.is_valid else None
    except Exception as exc:
        telemetry_errors.count("client.trace_id", exc)
        return None


def _safe_set_status(span: Span, status: Status) -> None:
    try:
        span.set_status(status)
    except Exception as exc:
        telemetry_errors.count("client.status", exc)


def _finish_span(span: Span, recorder: StageRecorder, tokenize_seconds: float,
                 tokenize_end_ns: int, decode_seconds: float, status_code: int) -> None:
    try:
        recorder.record(StageId.CLIENT_TOKENIZE, tokenize_seconds, end_ns=tokenize_end_ns)
        recorder.record(StageId.CLIENT_DECODE, decode_seconds)
        span.set_attribute(attr.HTTP_RESPONSE_STATUS_CODE, status_code)
        if status_code >= 400 or status_code == 0:
            span.set_status(Status(StatusCode.ERROR))
        recorder.flush()
    except Exception as exc:
        telemetry_errors.count("client.finish", exc)
    finally:
        try:
            span.end()
        except Exception as exc:
            telemetry_errors.count("client.end", exc)
