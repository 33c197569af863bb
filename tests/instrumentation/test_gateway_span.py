"""The gateway shim's directly written span (instrumentation/gateway_span.py): the same
OTLP/HTTP request bodies, byte for byte, as the SDK's span with the same writes, over a
real exporter on loopback; the SDK span wherever the writer must not run; and the SDK's
own semantics (limits, drop counts, statuses, sampling) for everything else."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace import _Span as SdkSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    Decision,
    Sampler,
    SamplingResult,
)
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from tests.fakes.otlp_http import OtlpHttpReceiver
from tests.instrumentation.reference.support import run_async
from tokenpath import attributes as attr
from tokenpath.instrumentation import gateway_span
from tokenpath.instrumentation.gateway import (
    GatewayConfig,
    TokenpathGatewayMiddleware,
    gateway_stage,
    mark_engine_handoff,
    trace_headers,
)
from tokenpath.instrumentation.gateway_span import GatewaySpan, GatewaySpanWriter
from tokenpath.instrumentation.otlp_exporter import (
    TokenpathBatchSpanProcessor,
    TokenpathOTLPSpanExporter,
)
from tokenpath.instrumentation.safety import telemetry_errors
from tokenpath.instrumentation.span_attributes import set_span_attributes
from tokenpath.instrumentation.stage_recorder import StageEntry, write_stage_events
from tokenpath.stages import STAGE_IDS, Phase, Provenance, StageId

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class _SameIds(IdGenerator):
    """The same ids after each :meth:`reset`: both paths' spans get equal ids."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._next = 0x1000

    def generate_span_id(self) -> int:
        self._next += 1
        return self._next

    def generate_trace_id(self) -> int:
        return 0x5EED0000000000000000000000000001


class _RecordOnly(Sampler):
    def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
        return SamplingResult(Decision.RECORD_ONLY, {"sampler.said": "record"})

    def get_description(self) -> str:
        return "record only"


@dataclass
class _Exporting:
    """A provider exporting through tokenpath's processor and exporter to ``receiver``."""

    provider: TracerProvider
    ids: _SameIds
    receiver: OtlpHttpReceiver

    @property
    def tracer(self) -> Any:
        return self.provider.get_tracer("tokenpath.test", "1")

    def body(self) -> bytes | None:
        """The request body exported since the last call (None for none)."""
        before = len(self.receiver.bodies)
        assert self.provider.force_flush(10_000)
        bodies = self.receiver.bodies[before:]
        assert len(bodies) <= 1
        return bodies[0] if bodies else None


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpHttpReceiver]:
    made = OtlpHttpReceiver()
    yield made
    made.close()


def _exporting(receiver: OtlpHttpReceiver, limits: SpanLimits | None = None,
               sampler: Sampler | None = None) -> _Exporting:
    ids = _SameIds()
    provider = TracerProvider(resource=Resource.create({"service.name": "gateway-span-test"}),
                              id_generator=ids, span_limits=limits, sampler=sampler,
                              shutdown_on_exit=False)
    provider.add_span_processor(TokenpathBatchSpanProcessor(
        TokenpathOTLPSpanExporter(endpoint=receiver.url), schedule_delay_millis=60_000))
    return _Exporting(provider, ids, receiver)


@pytest.fixture
def exporting(receiver: OtlpHttpReceiver) -> Iterator[_Exporting]:
    made = _exporting(receiver)
    yield made
    made.provider.shutdown()


# What an app may do to the gateway's span while a request runs: one call each.
Operation = Callable[[trace.Span], None]

_values = st.one_of(st.integers(-(1 << 40), 1 << 40), st.floats(allow_nan=False),
                    st.booleans(), st.text(max_size=8))
_keys = st.sampled_from([attr.URL_PATH, attr.STATUS, attr.RESPONSE_BYTES, "app.key", "app.k2"])
_operations: st.SearchStrategy[Operation] = st.one_of(
    st.builds(lambda k, v: lambda s: s.set_attribute(k, v), _keys, _values),
    st.builds(lambda a: lambda s: s.set_attributes(a), st.dictionaries(_keys, _values,
                                                                        max_size=3)),
    st.builds(lambda n, a, t: lambda s: s.add_event(n, a, t), st.text(min_size=1, max_size=6),
              st.dictionaries(_keys, _values, max_size=2), st.integers(1, 1 << 62)),
    st.builds(lambda c, d: lambda s: s.set_status(Status(c, d)),
              st.sampled_from(list(StatusCode)), st.none() | st.text(max_size=6)),
    st.builds(lambda c: lambda s: s.set_status(c), st.sampled_from(list(StatusCode))),
    st.builds(lambda n: lambda s: s.update_name(n), st.text(min_size=1, max_size=10)),
    st.builds(lambda t: lambda s: s.record_exception(ValueError("bad"), {"app.k2": 1}, t),
              st.integers(1, 1 << 62)),
    st.builds(lambda i: lambda s: s.add_link(SpanContext(7, i, False, TraceFlags(1))),
              st.integers(1, 1 << 60)),
)
_stage_entries: st.SearchStrategy[StageEntry] = st.tuples(
    st.sampled_from(STAGE_IDS), st.floats(0, 10), st.none() | st.sampled_from(list(Phase)),
    st.none() | st.sampled_from(list(Provenance)), st.integers(1, 1 << 62))
_parents = st.none() | st.builds(
    lambda t, s, state: SpanContext(t, s, True, TraceFlags(TraceFlags.SAMPLED),
                                    TraceState(state)),
    st.integers(1, (1 << 128) - 1), st.integers(1, (1 << 64) - 1),
    st.lists(st.tuples(st.sampled_from(["ven", "dor"]), st.sampled_from(["a", "b1"])),
             max_size=1))


def _sdk_path(exporting: _Exporting, name: str, context: Any, attributes: dict[str, Any],
              operations: list[Operation], stages: list[StageEntry],
              end_attributes: dict[str, Any], error: bool, times: tuple[int, int]) -> Any:
    """What the shim writes on an SDK span (gateway.py, without the writer)."""
    span = exporting.tracer.start_span(name, context=context, kind=SpanKind.SERVER,
                                       attributes=attributes, start_time=times[0])
    for operation in operations:
        operation(span)
    set_span_attributes(span, end_attributes)
    if error:
        span.set_status(Status(StatusCode.ERROR))
    write_stage_events(span, stages)
    span.end(times[1])
    return span


def _written_path(exporting: _Exporting, name: str, context: Any, attributes: dict[str, Any],
                  operations: list[Operation], stages: list[StageEntry],
                  end_attributes: dict[str, Any], error: bool, times: tuple[int, int]) -> Any:
    writer = GatewaySpanWriter.for_tracer(exporting.tracer)
    assert writer is not None
    span = writer.start_span(name, context, SpanKind.SERVER, attributes, start_time=times[0])
    for operation in operations:
        operation(span)
    assert isinstance(span, GatewaySpan)
    span.end_request(stages, end_attributes, error, end_time=times[1])
    return span


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(limits=st.builds(SpanLimits, max_span_attributes=st.sampled_from([None, 3, 7]),
                        max_events=st.sampled_from([None, 2]),
                        max_span_attribute_length=st.sampled_from([None, 4])),
       parent=_parents, path=st.text(max_size=12),
       operations=st.lists(_operations, max_size=4),
       stages=st.lists(_stage_entries, max_size=7),
       end_attributes=st.dictionaries(_keys, _values, max_size=5), error=st.booleans(),
       start=st.integers(1, 1 << 61), duration=st.integers(0, 1 << 40))
def test_a_written_span_exports_the_sdk_spans_bytes(
    receiver: OtlpHttpReceiver, limits: SpanLimits, parent: SpanContext | None, path: str,
    operations: list[Operation], stages: list[StageEntry], end_attributes: dict[str, Any],
    error: bool, start: int, duration: int,
) -> None:
    exporting = _exporting(receiver, limits)
    try:
        context = None if parent is None else trace.set_span_in_context(
            NonRecordingSpan(parent))
        request = (f"POST {path}", context, {attr.HTTP_REQUEST_METHOD: "POST",
                                             attr.URL_PATH: path})
        bodies = []
        for write in (_sdk_path, _written_path):
            exporting.ids.reset()
            write(exporting, *request, operations, stages, end_attributes, error,
                  (start, start + duration))
            bodies.append(exporting.body())
        assert bodies[0] is not None
        assert bodies[1] == bodies[0]
    finally:
        exporting.provider.shutdown()


def test_the_span_is_written_directly_without_app_calls(exporting: _Exporting) -> None:
    writer = GatewaySpanWriter.for_tracer(exporting.tracer)
    assert writer is not None
    span = writer.start_span("GET /", None, SpanKind.SERVER, {attr.URL_PATH: "/"})
    assert isinstance(span, GatewaySpan) and span.is_recording()
    span.end_request([(StageId.ROUTER, 0.5, None, None, 12)], {attr.RESPONSE_BYTES: 3}, False)
    assert not span.is_recording()
    assert span._sdk is None  # no SDK span was made
    body = exporting.body()
    assert body is not None
    (written,) = ExportTraceServiceRequest.FromString(body).resource_spans[0].scope_spans[0].spans
    assert written.name == "GET /"
    assert [e.name for e in written.events] == [attr.STAGE_EVENT]
    assert {kv.key for kv in written.attributes} == {attr.URL_PATH, attr.RESPONSE_BYTES}


def test_an_app_call_turns_it_into_the_sdk_span(exporting: _Exporting) -> None:
    writer = GatewaySpanWriter.for_tracer(exporting.tracer)
    assert writer is not None
    span = writer.start_span("GET /", None, SpanKind.SERVER, {})
    assert isinstance(span, GatewaySpan)
    span.set_attribute("app.key", "v")
    assert isinstance(span._sdk, SdkSpan)
    assert span._sdk.get_span_context() == span.get_span_context()
    span.end_request([], {}, error=True)
    assert not span._sdk.is_recording()
    body = exporting.body()
    assert body is not None
    (written,) = ExportTraceServiceRequest.FromString(body).resource_spans[0].scope_spans[0].spans
    assert [kv.key for kv in written.attributes] == ["app.key"]
    assert written.status.code == StatusCode.ERROR.value


def test_the_sdk_span_runs_unless_tokenpaths_processor_is_the_only_one(
    receiver: OtlpHttpReceiver,
) -> None:
    memory = InMemorySpanExporter()
    for processor in (SimpleSpanProcessor(memory), BatchSpanProcessor(memory)):
        provider = TracerProvider(shutdown_on_exit=False)
        provider.add_span_processor(processor)
        writer = GatewaySpanWriter.for_tracer(provider.get_tracer("t"))
        assert writer is not None and writer.processor() is None
        assert isinstance(writer.start_span("x", None, SpanKind.SERVER, {}), SdkSpan)
        provider.shutdown()
    exporting = _exporting(receiver)
    writer = GatewaySpanWriter.for_tracer(exporting.tracer)
    assert writer is not None
    assert isinstance(writer.start_span("x", None, SpanKind.SERVER, {}), GatewaySpan)
    exporting.provider.add_span_processor(SimpleSpanProcessor(memory))  # seen at once
    assert isinstance(writer.start_span("x", None, SpanKind.SERVER, {}), SdkSpan)
    exporting.provider.shutdown()
    assert GatewaySpanWriter.for_tracer(trace.NoOpTracer()) is None


def test_sampling_decisions_are_the_sdks(receiver: OtlpHttpReceiver) -> None:
    dropped = _exporting(receiver, sampler=ALWAYS_OFF)
    writer = GatewaySpanWriter.for_tracer(dropped.tracer)
    assert writer is not None
    span = writer.start_span("x", None, SpanKind.SERVER, {})
    assert not span.is_recording() and not span.get_span_context().trace_flags.sampled
    dropped.provider.shutdown()

    recorded = _exporting(receiver, sampler=_RecordOnly())
    writer = GatewaySpanWriter.for_tracer(recorded.tracer)
    assert writer is not None
    span = writer.start_span("x", None, SpanKind.SERVER, {})
    assert isinstance(span, GatewaySpan) and span.is_recording()
    assert not span.get_span_context().trace_flags.sampled
    span.end_request([(StageId.ROUTER, 0.1, None, None, 5)], {}, False)
    assert not span.is_recording()
    assert recorded.body() is None  # recorded, never exported: as the SDK's processor
    recorded.provider.shutdown()


def test_a_second_end_and_later_calls_are_ignored_with_a_warning(
    exporting: _Exporting, caplog: pytest.LogCaptureFixture,
) -> None:
    writer = GatewaySpanWriter.for_tracer(exporting.tracer)
    assert writer is not None
    span = writer.start_span("x", None, SpanKind.SERVER, {})
    span.end()
    with caplog.at_level(logging.WARNING, logger=gateway_span.__name__):
        span.end()
        span.set_attribute("late", 1)
        span.add_event("late")
    assert len(caplog.records) == 3
    body = exporting.body()
    assert body is not None
    (written,) = ExportTraceServiceRequest.FromString(body).resource_spans[0].scope_spans[0].spans
    assert list(written.attributes) == [] and list(written.events) == []


def test_an_encoding_failure_is_counted_and_the_sdk_span_exports_it(
    exporting: _Exporting, monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*args: object) -> bytes:
        raise RuntimeError("encoder bug")

    monkeypatch.setattr(gateway_span, "encode_plain_span", broken)
    before = telemetry_errors.by_place().get("gateway_span.encode", 0)
    writer = GatewaySpanWriter.for_tracer(exporting.tracer)
    assert writer is not None
    span = writer.start_span("x", None, SpanKind.SERVER, {attr.URL_PATH: "/"})
    assert isinstance(span, GatewaySpan)
    span.end_request([(StageId.ROUTER, 0.1, None, None, 5)], {attr.RESPONSE_BYTES: 2}, False)
    assert telemetry_errors.by_place()["gateway_span.encode"] == before + 1
    body = exporting.body()
    assert body is not None
    (written,) = ExportTraceServiceRequest.FromString(body).resource_spans[0].scope_spans[0].spans
    assert len(written.events) == 1 and len(written.attributes) == 2


def _request(exporting: _Exporting, config: GatewayConfig, seen: list[trace.Span],
             annotate: bool = False) -> None:
    """One streamed request through the shim (with a ``traceparent``), as a gateway app
    runs it; ``seen`` gets the span the app sees as current."""

    async def app(scope: object, receive: object, send: Any) -> None:
        with gateway_stage(StageId.AUTH_RATELIMIT):
            pass
        with gateway_stage(StageId.ROUTER):
            pass
        mark_engine_handoff()
        assert trace_headers()["traceparent"].split("-")[1] == TRACEPARENT.split("-")[1]
        current = trace.get_current_span()
        seen.append(current)
        if annotate:
            current.set_attribute("app.tier", "gold")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(3):
            await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, object]) -> None:
        pass

    middleware = TokenpathGatewayMiddleware(app, exporting.provider, config)
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
             "headers": [(b"traceparent", TRACEPARENT.encode())]}
    exporting.ids.reset()
    run_async(lambda: middleware(scope, receive, send))


def _timeless(body: bytes | None) -> Any:
    """The exported span with its times and the stages' measured seconds zeroed."""
    assert body is not None
    (span,) = ExportTraceServiceRequest.FromString(body).resource_spans[0].scope_spans[0].spans
    span.start_time_unix_nano = span.end_time_unix_nano = 0
    for kv in span.attributes:
        if kv.key in (attr.TTFT_SECONDS, attr.RESPONSE_WRITE_SECONDS):
            kv.value.double_value = 0.0
    for event in span.events:
        event.time_unix_nano = 0
        for kv in event.attributes:
            if kv.key == attr.STAGE_SECONDS:
                kv.value.double_value = 0.0
    return span


@pytest.mark.parametrize("annotate", [False, True])
def test_the_shim_exports_the_same_span_written_directly_or_by_the_sdk(
    exporting: _Exporting, annotate: bool,
) -> None:
    seen: list[trace.Span] = []
    _request(exporting, GatewayConfig(), seen, annotate)
    direct = _timeless(exporting.body())
    _request(exporting, GatewayConfig(direct_span_writing=False), seen, annotate)
    sdk = _timeless(exporting.body())
    assert isinstance(seen[0], GatewaySpan) and isinstance(seen[1], SdkSpan)
    assert direct == sdk
    assert direct.parent_span_id.hex() == TRACEPARENT.split("-")[2]
    assert len(direct.events) == 7  # the gateway's stages
    assert ("app.tier" in {kv.key for kv in direct.attributes}) is annotate
