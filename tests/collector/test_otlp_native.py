"""The compiled OTLP trace decoder (collector/receivers/_otlp_native.c) against the
pure-Python reference (protobuf's parser, then decode_traces): for any input it returns
exactly what the reference returns, or None and leaves the payload to the reference.

Results are compared field by field with each value's type (1, 1.0 and True are equal in
Python but not the same attribute) and floats by their repr (NaN, -0.0)."""

from __future__ import annotations

import shutil
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.support.otlp import export_request, to_otlp_json
from tests.support.otlp_strategies import mutated_bytes, trace_requests
from tokenpath import attributes as A
from tokenpath.collector.limits import IngestLimits
from tokenpath.collector.node_metrics import NodeMetricsState
from tokenpath.collector.receivers import otlp_decode
from tokenpath.collector.receivers.ingest import OtlpIngest
from tokenpath.collector.receivers.otlp_decode import (
    DECODER_COMPILED,
    DECODER_REFERENCE,
    DecodedSpans,
    MalformedPayload,
    decode_native,
    decode_trace_payload,
    decode_traces,
    parse_trace_request,
)
from tokenpath.collector.spans import SpanData
from tokenpath.collector.stats import CollectorStats

FUZZ = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
LIMITS = IngestLimits()
# Small enough that generated spans hit every limit: attributes, value lengths, events.
TIGHT_LIMITS = IngestLimits(max_attributes_per_span=3, max_attribute_value_length=2,
                            max_events_per_span=1)
KEEP_CONTENT = IngestLimits(keep_content_attributes=True)


def _compiler() -> bool:
    """A C compiler and Python's headers: what the package build needs to compile it."""
    compiler = shutil.which(str(sysconfig.get_config_var("CC") or "cc").split()[0])
    return compiler is not None and Path(sysconfig.get_paths()["include"], "Python.h").is_file()


@pytest.fixture(scope="module")
def native() -> ModuleType:
    module = otlp_decode._native
    if module is None:
        # Not skipped quietly where it could have been built: the package's own build
        # (setup.py) compiles it whenever a C compiler is there.
        assert not _compiler(), "a C compiler is here but the compiled decoder was not built"
        pytest.skip("no C compiler: the collector runs on the pure-Python decoder")
    return module


def _typed(value: object) -> object:
    if isinstance(value, tuple):
        return ("tuple", tuple(_typed(item) for item in value))
    if isinstance(value, float):
        return ("float", repr(value))
    return (type(value).__name__, value)


def _attributes(attributes: dict[str, object]) -> list[tuple[str, object]]:
    return [(key, _typed(value)) for key, value in attributes.items()]


def _comparable(decoded: DecodedSpans) -> object:
    spans = [(s.trace_id, s.span_id, s.parent_span_id, s.name, _typed(s.kind),
              s.start_unix_nano, s.end_unix_nano, _attributes(s.attributes),
              type(s.events).__name__,
              [(e.name, e.time_unix_nano, _attributes(e.attributes)) for e in s.events],
              _attributes(s.resource), _typed(s.status_code), _typed(s.remote_parent))
             for s in decoded.spans]
    return (spans, decoded.rejected, sorted(decoded.rejection_reasons.items()),
            decoded.attributes_dropped, decoded.content_attributes_dropped,
            decoded.values_truncated, decoded.events_dropped, decoded.content_events_dropped)


def _reference(body: bytes, limits: IngestLimits) -> DecodedSpans | None:
    try:
        return decode_traces(parse_trace_request(body, "protobuf"), limits)
    except MalformedPayload:
        return None


def _check_same(native: ModuleType, body: bytes, limits: IngestLimits) -> DecodedSpans | None:
    """Returns the compiled result (None where it left the payload to the reference)."""
    compiled = decode_native(body, limits, native)
    reference = _reference(body, limits)
    if compiled is not None:
        assert reference is not None, "compiled accepted what protobuf refuses"
        assert _comparable(compiled) == _comparable(reference)
    return compiled


@FUZZ
@given(request=trace_requests(), limits=st.sampled_from([LIMITS, TIGHT_LIMITS, KEEP_CONTENT]))
def test_valid_requests_decode_exactly_as_the_reference(
        native: ModuleType, request: ExportTraceServiceRequest, limits: IngestLimits) -> None:
    body = request.SerializeToString()
    # Everything protobuf itself writes is in the compiled decoder's range: it must decide.
    assert _check_same(native, body, limits) is not None


@FUZZ
@given(data=st.data(), request=trace_requests())
def test_mutated_requests_decode_as_the_reference_or_are_left_to_it(
        native: ModuleType, data: st.DataObject, request: ExportTraceServiceRequest) -> None:
    body = data.draw(mutated_bytes(request.SerializeToString()))
    _check_same(native, body, data.draw(st.sampled_from([LIMITS, TIGHT_LIMITS])))


@FUZZ
@given(body=st.binary(max_size=300))
def test_random_bytes_never_differ(native: ModuleType, body: bytes) -> None:
    _check_same(native, body, LIMITS)


def _span(**fields: object) -> Span:
    span = Span(trace_id=bytes(range(1, 17)), span_id=bytes(range(1, 9)), name="s",
                start_time_unix_nano=10, end_time_unix_nano=20)
    for key, value in fields.items():
        setattr(span, key, value)
    return span


def _body_with_span_bytes(span_bytes: bytes) -> bytes:
    """A request around one span given as raw wire bytes."""
    def field(number: int, payload: bytes) -> bytes:
        return _varint(number << 3 | 2) + _varint(len(payload)) + payload
    return field(1, field(2, field(2, span_bytes)))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


@pytest.mark.parametrize("extra, why", [
    (b"\x7a\x02\x18\x02" + b"\x7a\x02\x18\x01", "status sent twice: protobuf merges"),
    (b"\x2a\x02\xff\xfe", "a span name that is not UTF-8: protobuf refuses it"),
    (b"\x33\x34", "a group: left to protobuf"),
    (b"\x30", "truncated: protobuf refuses it"),
    (b"\x31" + bytes(8), "kind with the wrong wire type"),
])
def test_what_it_does_not_decode_exactly_is_left_to_the_reference(
        native: ModuleType, extra: bytes, why: str) -> None:
    body = _body_with_span_bytes(_span().SerializeToString() + extra)
    assert decode_native(body, LIMITS, native) is None, why
    # ... and the collector still answers as protobuf does: decoded or refused.
    reference = _reference(body, LIMITS)
    if reference is None:
        with pytest.raises(MalformedPayload):
            decode_trace_payload(body, "protobuf", LIMITS)
    else:
        decoded, decoder = decode_trace_payload(body, "protobuf", LIMITS)
        assert decoder == DECODER_REFERENCE
        assert _comparable(decoded) == _comparable(reference)


def test_attributes_split_around_other_fields_decode_as_one_set(native: ModuleType) -> None:
    """Repeated fields need not be contiguous on the wire (protobuf appends them)."""
    first = KeyValue(key=A.STAGE, value=AnyValue(string_value="kernels")).SerializeToString()
    second = KeyValue(key=A.PHASE, value=AnyValue(string_value="decode")).SerializeToString()
    span_bytes = (_span().SerializeToString() + b"\x4a" + _varint(len(first)) + first
                  + b"\x30\x02" + b"\x4a" + _varint(len(second)) + second)
    compiled = _check_same(native, _body_with_span_bytes(span_bytes), LIMITS)
    assert compiled is not None
    assert compiled.spans[0].attributes == {A.STAGE: "kernels", A.PHASE: "decode"}
    assert compiled.spans[0].kind == 2


def test_shared_attribute_sets_count_their_limits_each_time(native: ModuleType) -> None:
    """Spans with the same attribute bytes share one dict, and each still counts what the
    limits cut from it, as the reference does."""
    attributes = [KeyValue(key=f"k{i}", value=AnyValue(string_value="a long value"))
                  for i in range(5)] + [KeyValue(key="gen_ai.prompt",
                                                 value=AnyValue(string_value="secret"))]
    spans = []
    for i in range(4):
        span = _span(span_id=bytes([i + 1]) * 8)
        span.attributes.extend(attributes)
        spans.append(span)
    body = export_request(spans).SerializeToString()
    compiled = _check_same(native, body, TIGHT_LIMITS)
    assert compiled is not None
    assert compiled.attributes_dropped == 4 * 2
    assert compiled.values_truncated == 4 * 3
    assert compiled.content_attributes_dropped == 4
    assert compiled.spans[0].attributes is compiled.spans[3].attributes
    assert "secret" not in repr(compiled.spans)


@pytest.fixture
def bench_payloads() -> Iterator[list[bytes]]:
    from bench.payloads import make_requests
    yield make_requests(5, spans_per_request=100)


def test_the_bench_payloads_decode_exactly(native: ModuleType,
                                           bench_payloads: list[bytes]) -> None:
    for body in bench_payloads:
        assert _check_same(native, body, LIMITS) is not None


def test_the_receivers_decode_with_it(native: ModuleType, monkeypatch: pytest.MonkeyPatch,
                                      bench_payloads: list[bytes]) -> None:
    calls: list[bytes] = []

    class Counting:
        @staticmethod
        def decode_traces(body: bytes, config: tuple[object, ...]) -> object:
            calls.append(body)
            return native.decode_traces(body, config)

    monkeypatch.setattr(otlp_decode, "_native", Counting)
    stats = CollectorStats()
    ingest = OtlpIngest(_Spans(), NodeMetricsState(), LIMITS, stats)
    decoded = ingest.export_trace_payload(bench_payloads[0], "protobuf", "test")
    assert calls == [bench_payloads[0]] and len(decoded.spans) == 100
    json_body = to_otlp_json(ExportTraceServiceRequest.FromString(bench_payloads[1]))
    assert len(ingest.export_trace_payload(json_body, "json", "test").spans) == 100
    assert calls == [bench_payloads[0]]  # OTLP/JSON is the reference's
    assert stats.trace_exports_decoded[DECODER_COMPILED] == 1
    assert stats.trace_exports_decoded[DECODER_REFERENCE] == 1


class _Spans:
    def consume_spans(self, spans: list[SpanData]) -> dict[str, int]:
        return {}



def test_decoding_leaks_nothing_on_any_path(native: ModuleType,
                                            bench_payloads: list[bytes]) -> None:
    """The C code's references and allocations balance on every path: decoded payloads,
    payloads left to the reference part-way through (a truncated one, one with a bad
    string late in it), content keys (Py_None in its key table) and booleans. Python's
    allocator traces what it allocates (tracemalloc) and singletons count references."""
    import gc
    import sys
    import tracemalloc

    content = _span()
    content.attributes.extend([KeyValue(key="gen_ai.prompt", value=AnyValue(string_value="x")),
                               KeyValue(key="ok", value=AnyValue(bool_value=True))])
    valid = [*bench_payloads[:2], export_request([content]).SerializeToString()]
    left_to_reference = [bench_payloads[0][: len(bench_payloads[0]) // 2],
                         _body_with_span_bytes(_span().SerializeToString() * 3
                                               + b"\x2a\x02\xff\xfe")]
    for body in left_to_reference:
        assert decode_native(body, LIMITS, native) is None

    def decode_all() -> None:
        for body in (*valid, *left_to_reference):
            decode_native(body, LIMITS, native)

    decode_all()  # warm: caches, interned strings, the config
    gc.collect()
    none_refs, true_refs = sys.getrefcount(None), sys.getrefcount(True)
    for _ in range(50):
        decode_all()
    gc.collect()
    # one reference kept (or dropped) per decode would be 250 here
    assert abs(sys.getrefcount(None) - none_refs) < 10
    assert abs(sys.getrefcount(True) - true_refs) < 10
    tracemalloc.start()
    try:
        decode_all()
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(50):
            decode_all()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 4096, f"{grown} bytes kept after 50 rounds"
