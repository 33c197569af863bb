"""Gateway shim for ASGI apps (FastAPI, Starlette or any ASGI callable).

:class:`GatewayInstrumentor` wraps an app's middleware stack, in the style of
OpenTelemetry's contrib instrumentors (``instrument_app``/``uninstrument_app``,
idempotent, accepts a tracer provider). For every HTTP request it opens one SERVER span
(parent taken from the incoming ``traceparent``) and records on it, as ``STAGE_EVENT``
events through the hook API:

- ``api_gateway``: the gateway's own time: arrival to the hand-off to the engine
  (:func:`mark_engine_handoff`), minus the auth/rate-limit and router stages; for
  requests that never reach an engine, the whole request minus those stages;
- ``auth_ratelimit`` and ``router``: timed by the app with :func:`gateway_stage`;
- ``response_path``: total time spent writing response chunks (the ``send`` calls);
- ``switch_hop``, ``nic_tx``, ``ethernet_serialize`` (provenance derived) from the
  response bytes and chunk sizes, see :mod:`tokenpath.instrumentation.network`;

and the attributes TTFT_SECONDS (arrival to the first response body byte), response
bytes, chunks, packets, small packets and write seconds. Of an LLM call it reads, never
content, the request body's top-level ``model`` (``gen_ai.request.model``) and, from the
end of the response, the numbers of its ``usage`` and of vLLM's per-request ``metrics``
(:mod:`tokenpath.instrumentation.llm_payload`; what the app annotates itself wins).
:func:`trace_headers` gives the ``traceparent`` for the engine so gateway and engine spans
share one trace.

Every telemetry step is guarded: if tracing fails the request is served untouched.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Awaitable, Callable, MutableMapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tokenpath import attributes as attr
from tokenpath.instrumentation.engine_trace import get_tracer
from tokenpath.instrumentation.llm_payload import (
    MAX_REQUEST_BYTES,
    ResponseTail,
    request_model,
    response_attributes,
)
from tokenpath.instrumentation.network import (
    LinkModel,
    ResponseTally,
    derive_network_stages,
)
from tokenpath.instrumentation.request_ids import request_id_for
from tokenpath.instrumentation.safety import telemetry_errors
from tokenpath.instrumentation.span_attributes import set_span_attributes
from tokenpath.instrumentation.stage_recorder import StageRecorder
from tokenpath.instrumentation.tenants import TenantConfig, TenantResolver
from tokenpath.stages import Provenance, StageId

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

DEFAULT_EXCLUDED_PATHS = ("/healthz", "/metrics", "/v1/models")
_PROPAGATOR = TraceContextTextMapPropagator()
# The W3C trace-context headers as ASGI servers pass header names: lowercased bytes. A
# name of the same length is lowercased before the test, for servers and middleware that
# do not lowercase; other headers are skipped on their length alone.
_TRACE_HEADERS = frozenset(name.encode("latin-1") for name in _PROPAGATOR.fields)
_TRACE_HEADER_LENGTHS = frozenset(len(name) for name in _TRACE_HEADERS)
_RESPONSE_START = "http.response.start"
_RESPONSE_BODY = "http.response.body"
_REQUEST_BODY = "http.request"
_BODY_METHODS = frozenset({"POST", "PUT"})
_ERROR_STATUS = Status(StatusCode.ERROR)


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    link: LinkModel = field(default_factory=LinkModel)
    excluded_paths: tuple[str, ...] = DEFAULT_EXCLUDED_PATHS
    tenants: TenantConfig = field(default_factory=TenantConfig)  # instrumentation/tenants.py

    def validate(self) -> None:
        self.link.validate()
        self.tenants.validate()


class GatewayRequest:
    """Telemetry state of one request passing the gateway (see :func:`current_request`)."""

    __slots__ = ("_handoff", "_handoff_ns", "extra", "first_write", "last_write", "recorder",
                 "response_tail", "span", "started", "tally", "write_seconds")

    def __init__(self, span: Span) -> None:
        self.span = span
        self.recorder = StageRecorder(span)
        self.started = time.perf_counter()
        self._handoff: float | None = None
        self._handoff_ns: int | None = None
        self.tally = ResponseTally()
        self.write_seconds = 0.0
        # when the first and the last body write began (perf_counter seconds)
        self.first_write: float | None = None
        self.last_write: float | None = None
        self.extra: dict[str, Any] = {}  # attributes set by the app, written at the end
        self.response_tail = ResponseTail()  # the last body writes: usage and metrics

    @property
    def ttft(self) -> float | None:
        """Arrival to the first response body byte."""
        return None if self.first_write is None else self.first_write - self.started

    def handoff(self) -> None:
        if self._handoff is None:
            self._handoff = time.perf_counter()
            self._handoff_ns = time.time_ns()

    @property
    def handoff_ns(self) -> int | None:
        return self._handoff_ns

    def own_seconds(self, now: float) -> float:
        """api_gateway: to the engine hand-off (or the end) minus the app-timed stages."""
        end = self._handoff if self._handoff is not None else now
        timed = self.recorder.seconds(StageId.AUTH_RATELIMIT, StageId.ROUTER)
        if self._handoff is None:
            timed += self.write_seconds
        return max(0.0, end - self.started - timed)


_current: contextvars.ContextVar[GatewayRequest | None] = contextvars.ContextVar(
    "tokenpath_gateway_request", default=None
)


def current_request() -> GatewayRequest | None:
    return _current.get()


class _GatewayStageTimer:
    """The ``with`` body as a gateway stage of the current request (nothing outside one).
    A class rather than a generator context manager: it runs twice a request."""

    __slots__ = ("_request", "_stage", "_start")

    def __init__(self, stage: StageId) -> None:
        self._stage = stage
        self._request: GatewayRequest | None = None
        self._start = 0.0

    def __enter__(self) -> None:
        self._request = _current.get()
        if self._request is not None:
            self._start = time.perf_counter()

    def __exit__(self, *exc_info: object) -> None:
        request = self._request
        if request is not None:  # an exception in the body still ends the stage, then raises
            request.recorder.record(self._stage, time.perf_counter() - self._start)


def gateway_stage(stage: StageId) -> AbstractContextManager[None]:
    """Time the ``with`` body as a gateway stage of the current request (no-op outside)."""
    return _GatewayStageTimer(stage)


def mark_engine_handoff() -> None:
    """The request is handed to an engine now: the gateway's own time ends here."""
    request = _current.get()
    if request is not None:
        request.handoff()


def annotate(key: str, value: Any) -> None:
    """Set an attribute on the current gateway span (no-op outside a request)."""
    request = _current.get()
    if request is not None:
        request.extra[key] = value


def trace_headers() -> dict[str, str]:
    """W3C ``traceparent`` (and ``tracestate``) of the current span, for the engine."""
    carrier: dict[str, str] = {}
    try:
        _PROPAGATOR.inject(carrier)
    except Exception as exc:
        telemetry_errors.count("gateway.trace_headers", exc)
    return carrier


def engine_request_id() -> str | None:
    """An engine request id naming the current span's trace, to send to a vLLM engine as
    its ``X-Request-Id`` (``request_ids.REQUEST_ID_HEADER``): tokenpath's vLLM plugin then
    puts its annotation of the request into this trace, which keeps it with the request
    when collectors are sharded by trace id. None outside a traced request."""
    try:
        return request_id_for(trace.get_current_span().get_span_context())
    except Exception as exc:
        telemetry_errors.count("gateway.engine_request_id", exc)
        return None


class _TracedSend:
    """The ASGI ``send`` the app gets: times and counts each response body write.

    Runs for every chunk of a stream, so it does as little as it can (measured per chunk
    in docs/performance.md); the wall clock of the last write is taken at the end. One
    object a request, where a closure over the same state was nine the garbage collector
    tracks while the request runs.

    The response's last message goes to the server outside the request's context: the
    server completes its response cycle in that call (uvicorn schedules the connection's
    keep-alive timeout there), and a callback scheduled then keeps a copy of the context
    it was scheduled in. Inside the request's context that copy would hold the request,
    its span and its stage entries as long as the timer lives (a cancelled one stays in
    the event loop's heap until purged, for up to the keep-alive timeout), for every
    request served on a kept-alive connection (docs/performance.md)."""

    __slots__ = ("_link", "_outer", "_request", "_send", "status_code")

    def __init__(self, request: GatewayRequest, send: Send, link: LinkModel,
                 outer: tuple[otel_context.Context, GatewayRequest | None]) -> None:
        self._request = request
        self._send = send
        self._link = link
        self._outer = outer  # the OpenTelemetry context and gateway request around this one
        self.status_code = 0

    def __call__(self, message: Message) -> Awaitable[None]:
        kind = message.get("type")
        body = message.get("body") if kind == _RESPONSE_BODY else None
        if not body:
            if kind == _RESPONSE_START:
                self.status_code = int(message.get("status", 0))
            elif kind == _RESPONSE_BODY and not message.get("more_body", False):
                return self._last(message)
            # headers, or an empty body that is not the last: nothing to time or count,
            # so the server's own send is what the app awaits (no coroutine of ours)
            return self._send(message)
        return self._timed(message, body)

    async def _timed(self, message: Message, body: bytes) -> None:
        last = not message.get("more_body", False)
        t0 = time.perf_counter()
        if last:
            await self._last(message)
        else:
            await self._send(message)
        t1 = time.perf_counter()
        try:
            request = self._request
            if request.first_write is None:
                request.first_write = t0
            request.last_write = t0
            request.write_seconds += t1 - t0
            request.tally.add_chunk(len(body), self._link)
            request.response_tail.add(body)
        except Exception as exc:
            telemetry_errors.count("gateway.send", exc)

    async def _last(self, message: Message) -> None:
        """The server's send of the last message, in the context around the request."""
        outside: tuple[contextvars.Token[Any], contextvars.Token[otel_context.Context]] | None
        try:
            context, request = self._outer
            outside = (_current.set(request), otel_context.attach(context))
        except Exception as exc:
            telemetry_errors.count("gateway.send_outside", exc)
            outside = None
        try:
            await self._send(message)
        finally:
            if outside is not None:
                try:
                    otel_context.detach(outside[1])
                    _current.reset(outside[0])
                except Exception as exc:
                    telemetry_errors.count("gateway.send_outside", exc)


class _ModelReceive:
    """The ``receive`` the app gets for a request with a body: hands each message on as it
    came and, once the body is whole, reads its top-level ``model`` onto the span (bodies
    over llm_payload.MAX_REQUEST_BYTES are not read)."""

    __slots__ = ("_done", "_parts", "_receive", "_request", "_size")

    def __init__(self, receive: Receive, request: GatewayRequest) -> None:
        self._receive = receive
        self._request = request
        self._parts: list[bytes] | None = None
        self._size = 0
        self._done = False

    async def __call__(self) -> Message:
        message = await self._receive()
        if not self._done:
            try:
                self._see(message)
            except Exception as exc:
                self._done = True
                telemetry_errors.count("gateway.request_model", exc)
        return message

    def _see(self, message: Message) -> None:
        if message.get("type") != _REQUEST_BODY:
            self._done = True  # a disconnect
            return
        body = message.get("body") or b""
        more = bool(message.get("more_body", False))
        parts = self._parts
        if parts is None and not more:  # the whole body in one message: the common case
            whole = body
        else:
            if parts is None:
                parts = self._parts = []
            self._size += len(body)
            if self._size > MAX_REQUEST_BYTES:
                self._done, self._parts = True, None
                return
            parts.append(body)
            if more:
                return
            whole = b"".join(parts)
        self._done, self._parts = True, None
        model = request_model(whole)
        if model is not None:
            self._request.extra.setdefault(attr.GEN_AI_REQUEST_MODEL, model)


class TokenpathGatewayMiddleware:
    """ASGI middleware recording the gateway stages of every HTTP request."""

    def __init__(self, app: ASGIApp, tracer_provider: TracerProvider | None = None,
                 config: GatewayConfig | None = None) -> None:
        self.app = app
        self.config = config or GatewayConfig()
        self.config.validate()
        self._tracer = get_tracer(tracer_provider)
        self._tenants = TenantResolver(self.config.tenants)
        wanted = {*_TRACE_HEADERS, *(n.encode("latin-1") for n in self._tenants.header_names)}
        self._wanted_headers = frozenset(wanted)
        self._wanted_lengths = frozenset(len(name) for name in wanted)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("path") in self.config.excluded_paths:
            await self.app(scope, receive, send)
            return
        outer = (otel_context.get_current(), _current.get())
        started = self._start(scope)
        if started is None:
            await self.app(scope, receive, send)
            return
        request, token, context_token = started
        traced_send = _TracedSend(request, send, self.config.link, outer)
        if scope.get("method") in _BODY_METHODS:
            receive = _ModelReceive(receive, request)
        failed = False
        try:
            await self.app(scope, receive, traced_send)
        except BaseException:
            # Before the response started: a 500. After (a stream that broke mid-way): the
            # status on the wire stays, and the request is still recorded as failed.
            traced_send.status_code = traced_send.status_code or 500
            failed = True
            raise
        finally:
            self._finish(request, traced_send.status_code, failed)
            _current.reset(token)
            try:
                otel_context.detach(context_token)
            except Exception as exc:
                telemetry_errors.count("gateway.detach", exc)

    def _start(self, scope: Scope) -> tuple[
        GatewayRequest, contextvars.Token[Any], contextvars.Token[otel_context.Context]
    ] | None:
        try:
            lengths, wanted = self._wanted_lengths, self._wanted_headers
            headers = {
                key.decode("latin-1").lower(): value.decode("latin-1")
                for key, value in scope.get("headers") or ()
                if len(key) in lengths and key.lower() in wanted
            }
            tenant = self._tenants.resolve(headers) if headers else None
            for name in self._tenants.header_names:  # the key never goes further
                headers.pop(name, None)
            parent = _PROPAGATOR.extract(carrier=headers) if headers else None
            method = str(scope.get("method", "GET"))
            path = str(scope.get("path", ""))
            attributes: dict[str, str] = {attr.HTTP_REQUEST_METHOD: method, attr.URL_PATH: path}
            if tenant is not None:
                attributes[attr.TENANT] = tenant
            span = self._tracer.start_span(f"{method} {path}", context=parent,
                                           kind=SpanKind.SERVER, attributes=attributes)
            request = GatewayRequest(span)
            context_token = otel_context.attach(trace.set_span_in_context(span, parent))
            return request, _current.set(request), context_token
        except Exception as exc:
            telemetry_errors.count("gateway.start", exc)
            return None

    def _finish(self, request: GatewayRequest, status_code: int, failed: bool) -> None:
        try:
            now = time.perf_counter()
            recorder = request.recorder
            link = self.config.link
            now_ns = time.time_ns()
            handoff_ns, last_write = request.handoff_ns, request.last_write
            switch_hop, nic_tx, ethernet = derive_network_stages(request.tally, link)
            derived = Provenance.DERIVED
            recorder.record_all((
                (StageId.API_GATEWAY, request.own_seconds(now), None, None,
                 now_ns if handoff_ns is None else handoff_ns),
                (StageId.RESPONSE_PATH, request.write_seconds, None, None,
                 now_ns if last_write is None else now_ns - round((now - last_write) * 1e9)),
                (StageId.SWITCH_HOP, switch_hop, None, derived, now_ns),
                (StageId.NIC_TX, nic_tx, None, derived, now_ns),
                (StageId.ETHERNET_SERIALIZE, ethernet, None, derived, now_ns),
            ))
            span = request.span
            tally = request.tally
            extra = request.extra
            extra[attr.HTTP_RESPONSE_STATUS_CODE] = status_code
            extra[attr.STATUS] = "ok" if 0 < status_code < 400 and not failed else "error"
            extra[attr.RESPONSE_BYTES] = tally.payload_bytes
            extra[attr.RESPONSE_CHUNKS] = tally.chunks
            extra[attr.RESPONSE_PACKETS] = tally.packets
            extra[attr.RESPONSE_SMALL_CHUNKS] = tally.small_chunks
            extra[attr.RESPONSE_WRITE_SECONDS] = request.write_seconds
            extra[attr.LINK_BITS_PER_SECOND] = link.link_bits_per_second
            ttft = request.ttft
            if ttft is not None and 0 < status_code < 400:  # not for refusals
                extra[attr.TTFT_SECONDS] = ttft
            if 200 <= status_code < 300 and request.response_tail.last is not None:
                try:
                    for key, value in response_attributes(request.response_tail.tail()).items():
                        extra.setdefault(key, value)  # what the app annotated wins
                except Exception as exc:
                    telemetry_errors.count("gateway.response_usage", exc)
            set_span_attributes(span, extra)
            if failed or status_code >= 500 or status_code == 0:
                span.set_status(_ERROR_STATUS)
            recorder.flush()
        except Exception as exc:
            telemetry_errors.count("gateway.finish", exc)
        finally:
            try:
                request.span.end()
            except Exception as exc:
                telemetry_errors.count("gateway.end", exc)


class GatewayInstrumentor:
    """Adds :class:`TokenpathGatewayMiddleware` around a Starlette/FastAPI app's stack.

    ``instrument_app(app)`` instruments one app; ``instrument()`` makes every
    ``fastapi.FastAPI`` created afterwards instrumented (apps whose module imported the
    class before the call are not affected, as with OpenTelemetry's instrumentors).
    """

    _ATTR = "_tokenpath_gateway_original_build"
    _original_fastapi: Any = None

    def instrument_app(self, app: Any, tracer_provider: TracerProvider | None = None,
                       config: GatewayConfig | None = None) -> None:
        """Instrument ``app``; a second call does nothing."""
        if getattr(app, self._ATTR, None) is not None:
            return
        original = app.build_middleware_stack
        gateway_config = config or GatewayConfig()
        gateway_config.validate()

        def build_middleware_stack() -> ASGIApp:
            return TokenpathGatewayMiddleware(original(), tracer_provider, gateway_config)

        setattr(app, self._ATTR, original)
        app.build_middleware_stack = build_middleware_stack
        app.middleware_stack = None  # rebuilt on the next request

    def uninstrument_app(self, app: Any) -> None:
        """Undo :meth:`instrument_app`; a second call does nothing."""
        original = getattr(app, self._ATTR, None)
        if original is None:
            return
        app.build_middleware_stack = original
        setattr(app, self._ATTR, None)
        app.middleware_stack = None

    @classmethod
    def is_instrumented(cls, app: Any) -> bool:
        return getattr(app, cls._ATTR, None) is not None

    def instrument(self, tracer_provider: TracerProvider | None = None,
                   config: GatewayConfig | None = None) -> None:
        """Instrument every FastAPI app created from now on; a second call does nothing."""
        import fastapi

        if GatewayInstrumentor._original_fastapi is not None:
            return
        original = fastapi.FastAPI
        instrumentor = self

        class InstrumentedFastAPI(original):  # type: ignore[misc,valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                instrumentor.instrument_app(self, tracer_provider, config)

        GatewayInstrumentor._original_fastapi = original
        fastapi.FastAPI = InstrumentedFastAPI  # type: ignore[misc]

    def uninstrument(self) -> None:
        """Undo :meth:`instrument` (apps already created stay instrumented)."""
        import fastapi

        original = GatewayInstrumentor._original_fastapi
        if original is None:
            return
        fastapi.FastAPI = original  # type: ignore[misc]
        GatewayInstrumentor._original_fastapi = None
