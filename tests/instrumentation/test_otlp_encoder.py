"""tokenpath's OTLP span encoder writes the stock OpenTelemetry encoder's bytes, byte for
byte, for every batch the SDK can hand an exporter: fuzzed with hypothesis over spans,
events, links, statuses, scopes, resources and every attribute value type (invalid ones
included), and checked on real spans of the gateway shim and of the SDK's tracer."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

from tests.instrumentation.reference.support import send, serving, workload_requests
from tokenpath import attributes as attr
from tokenpath.instrumentation import otlp_encoder
from tokenpath.instrumentation.otlp_encoder import encode_export_request


def _stock(spans: list[ReadableSpan]) -> bytes | None:
    """The stock encoder's bytes, or None where it refuses the whole batch."""
    try:
        return bytes(encode_spans(spans).SerializePartialToString())
    except Exception:
        return None


def _ours(spans: list[ReadableSpan]) -> bytes | None:
    try:
        return encode_export_request(spans)
    except Exception:
        return None


# --- strategies: what a ReadableSpan can hold, valid or not --------------------------

_INT64 = 1 << 63
_scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-_INT64, max_value=_INT64 - 1),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),  # some outside int64: dropped
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12), st.sampled_from(["", "api_gateway", "décodé", "\U0001F600" * 3]),
    st.binary(max_size=12),
    st.just("\ud800"),  # not valid Unicode: that attribute is dropped
    st.just(object()), st.just({1, 2}),  # types OTLP cannot hold: dropped
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.tuples(inner, inner),
        st.dictionaries(st.one_of(st.text(max_size=5), st.integers(0, 9)), inner, max_size=3),
    ),
    max_leaves=6,
)
_keys = st.one_of(st.sampled_from([attr.STAGE, attr.STAGE_SECONDS, attr.PHASE, "", "k"]),
                  st.text(max_size=10))
_attributes = st.one_of(st.none(), st.dictionaries(_keys, _values, max_size=5))
_ids = st.integers(min_value=1, max_value=(1 << 64) - 1)
_trace_ids = st.integers(min_value=1, max_value=(1 << 128) - 1)
_times = st.one_of(st.none(), st.just(0), st.integers(min_value=1, max_value=(1 << 64) - 1))
_trace_states = st.one_of(
    st.none(), st.just(TraceState()),
    st.just(TraceState([("vendor", "v1"), ("other", "x-2")])),
)


@st.composite
def _contexts(draw: Any) -> SpanContext:
    return SpanContext(draw(_trace_ids), draw(_ids), is_remote=draw(st.booleans()),
                       trace_flags=TraceFlags(draw(st.sampled_from([0, 1]))),
                       trace_state=draw(_trace_states))


_resources = st.sampled_from([
    Resource.create({"service.name": "gateway", "host.name": "h1"}),
    Resource.create({"service.name": "gateway", "host.name": "h1"}),  # equal: one group
    Resource({"service.name": "engine", "n": 3}, schema_url="https://schema/1"),
    Resource({}),
])
_scopes = st.sampled_from([
    None,
    InstrumentationScope("tokenpath", "1.0"),
    InstrumentationScope("tokenpath", "1.0"),
    InstrumentationScope("vllm", None, "https://schema/2", {"a": 1}),
    InstrumentationScope("", ""),
])
_statuses = st.one_of(
    st.none(), st.just(Status()), st.just(Status(StatusCode.OK)),
    st.builds(lambda text: Status(StatusCode.ERROR, text), st.text(max_size=8)),
)


@st.composite
def _events(draw: Any) -> Event:
    return Event(draw(st.sampled_from([attr.STAGE_EVENT, "", "exception"])),
                 draw(_attributes), draw(_times), limit=None)


@st.composite
def _links(draw: Any) -> Link:
    return Link(draw(_contexts()), draw(_attributes))


@st.composite
def _spans(draw: Any) -> ReadableSpan:
    return ReadableSpan(
        name=draw(st.sampled_from(["POST /v1/chat/completions", "", "llm_request", "é"])),
        context=draw(_contexts()),
        parent=draw(st.one_of(st.none(), _contexts())),
        resource=draw(_resources),
        attributes=draw(_attributes),
        events=draw(st.lists(_events(), max_size=4)),
        links=draw(st.lists(_links(), max_size=2)),
        kind=draw(st.sampled_from(list(SpanKind))),
        status=draw(_statuses),
        start_time=draw(_times),
        end_time=draw(_times),
        instrumentation_scope=draw(_scopes),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_spans(), max_size=6))
def test_fuzzed_batches_encode_to_the_stock_encoders_bytes(spans: list[ReadableSpan]) -> None:
    logging.disable(logging.CRITICAL)  # both encoders log each attribute they drop
    try:
        stock, ours = _stock(spans), _ours(spans)
    finally:
        logging.disable(logging.NOTSET)
    assert ours == stock


def test_an_attribute_that_cannot_be_encoded_is_dropped_alone_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    span = ReadableSpan("s", SpanContext(1, 2, is_remote=False), resource=Resource({}),
                        attributes={"ok": 1, "big": 1 << 64, "odd": object(), "bad": "\ud800",
                                    "also_ok": "v"})
    with caplog.at_level(logging.ERROR, logger=otlp_encoder.__name__):
        decoded = ExportTraceServiceRequest.FromString(encode_export_request([span]))
    keys = [kv.key for kv in decoded.resource_spans[0].scope_spans[0].spans[0].attributes]
    assert keys == ["ok", "also_ok"]
    assert sorted(r.getMessage().split("'")[1] for r in caplog.records) == ["bad", "big", "odd"]


def test_caches_stay_bounded_under_unique_keys_and_values() -> None:
    many = {f"key{i}": f"value{i}" for i in range(otlp_encoder.KEY_CACHE_LIMIT + 10)}
    span = ReadableSpan("s", SpanContext(1, 2, is_remote=False), resource=Resource({}),
                        attributes=many)
    assert encode_export_request([span]) == _stock([span])
    assert len(otlp_encoder._key_codes) <= otlp_encoder.KEY_CACHE_LIMIT
    for value in (f"v{i}" for i in range(otlp_encoder.CACHED_STRINGS_PER_KEY * 2)):
        one = ReadableSpan("s", SpanContext(1, 2, is_remote=False), resource=Resource({}),
                           attributes={"k": value})
        assert encode_export_request([one]) == _stock([one])
    assert len(otlp_encoder._key_codes["k"].strings) == otlp_encoder.CACHED_STRINGS_PER_KEY
    long_key = "k" * (otlp_encoder.CACHED_KEY_CHARS + 1)
    one = ReadableSpan("s", SpanContext(1, 2, is_remote=False), resource=Resource({}),
                       attributes={long_key: "v"})
    assert encode_export_request([one]) == _stock([one])
    assert long_key not in otlp_encoder._key_codes


def test_real_sdk_spans_with_stage_events_encode_identically() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "t"}),
                              shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with serving(provider) as path:
        results = send(path, provider, workload_requests(12, stream_share=0.5))
    assert {r.status_code for r in results} == {200}
    spans = list(exporter.get_finished_spans())
    assert sum(1 for s in spans for e in s.events if e.name == attr.STAGE_EVENT) > 12
    for start in range(0, len(spans), 7):
        batch = spans[start:start + 7]
        assert encode_export_request(batch) == _stock(batch)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(_spans(), st.booleans()), max_size=6))
def test_spans_encoded_as_they_end_make_the_same_request(
    spans_and_early: list[tuple[ReadableSpan, bool]],
) -> None:
    """What TokenpathBatchSpanProcessor queues (some spans encoded when they ended, some
    not where that failed) exports as the stock encoder's bytes of the spans."""
    spans = [span for span, _ in spans_and_early]
    logging.disable(logging.CRITICAL)
    try:
        stock = _stock(spans)
        try:
            mixed = [otlp_encoder.encode_span(span) if early else span
                     for span, early in spans_and_early]
        except Exception:
            mixed = None
        ours = None if mixed is None else _ours(mixed)  # type: ignore[arg-type]
    finally:
        logging.disable(logging.NOTSET)
    assert ours == stock


def test_the_remote_parent_flags_are_the_protos() -> None:
    from opentelemetry.proto.trace.v1 import trace_pb2

    assert otlp_encoder._FLAG_HAS_IS_REMOTE == trace_pb2.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
    assert otlp_encoder._FLAG_IS_REMOTE == trace_pb2.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
