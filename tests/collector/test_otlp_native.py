"""The compiled OTLP trace decoder (collector/receivers/_otlp_native.c) against the
pure-Python reference (protobuf's parser, then decode_traces): for any input it returns
exactly what the reference returns, or None and leaves the payload to the reference.

Results are compared field by field with each value's type (1, 1.0 and True are equal in
Python but not the same attribute) and floats by their repr (NaN, -0.0)."""

from __future__ import annotations

import shutil
import sysconfig
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from testkit.support import otlp_wire as wire
from testkit.support.otlp import export_request, to_otlp_json
from testkit.support.otlp_strategies import mutated_bytes, trace_requests
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
        assert not _compiler(), "a C compiler is here but the native decoder was not built"
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
    # Everything protobuf itself writes is in the native decoder's range: it must decide.
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


# --- what an independent differential fuzz found (hash flooding, overlong varints, UTF-8
# checked on the last copy only), and the structure-aware fuzzing that looks for more ----


def _refused_by_both(native: ModuleType, body: bytes) -> None:
    """The native decoder leaves ``body`` to the reference, which refuses it: the
    collector answers 400 / INVALID_ARGUMENT, as protobuf decides."""
    assert decode_native(body, LIMITS, native) is None
    assert _reference(body, LIMITS) is None
    with pytest.raises(MalformedPayload):
        decode_trace_payload(body, "protobuf", LIMITS)


@pytest.mark.parametrize("hex_body, why", [
    ("8a808080800000", "a tag in 6 bytes (padded)"),
    ("0a808080808000", "a length in 6 bytes (padded)"),
    ("0a09120712052a01ff2a00", "a span name sent twice, the first copy not UTF-8"),
    ("0a0b120912075a051201ff1200", "an event name sent twice, the first copy not UTF-8"),
])
def test_the_inputs_the_differential_fuzz_found_are_refused_as_protobuf_does(
        native: ModuleType, hex_body: str, why: str) -> None:
    _refused_by_both(native, bytes.fromhex(hex_body))


def _padded_request(span_bytes: bytes, tag: int, length: int) -> bytes:
    """A request around a span whose every tag and every length prefix (the span's own and
    those of the messages around it) take ``tag`` and ``length`` bytes."""
    def padded(f: wire.Field) -> wire.Field:
        tag_padding = tag - len(wire.varint(f.number << 3 | f.wire_type))
        if f.wire_type != wire.LENGTH_DELIMITED:
            return replace(f, tag_padding=tag_padding)
        assert isinstance(f.payload, bytes)
        return replace(f, tag_padding=tag_padding,
                       length_padding=length - len(wire.varint(len(f.payload))))

    fields = wire.parse(span_bytes)
    assert fields is not None
    body = wire.encode([padded(f) for f in fields])
    for number in (2, 2, 1):  # ScopeSpans.spans, ResourceSpans.scope_spans, resource_spans
        body = wire.encode([padded(wire.Field(number, wire.LENGTH_DELIMITED, body))])
    return body


def test_tags_and_lengths_take_up_to_5_bytes_as_in_protobuf(native: ModuleType) -> None:
    span = _span(parent_span_id=bytes(range(2, 10)), kind=2, flags=0x300)
    span.attributes.append(KeyValue(key="k", value=AnyValue(string_value="v")))
    span_bytes = span.SerializeToString()  # flags: field 16, a 2-byte tag
    for size in (2, 3, 4, 5):
        compiled = _check_same(native, _padded_request(span_bytes, size, size), LIMITS)
        assert compiled is not None and len(compiled.spans) == 1, size
        assert compiled.spans[0].remote_parent
    _refused_by_both(native, _padded_request(span_bytes, 6, 2))  # 6-byte tags
    _refused_by_both(native, _padded_request(span_bytes, 2, 6))  # 6-byte lengths
    _refused_by_both(native, _padded_request(span_bytes, 2, 10))  # 10-byte lengths


def test_values_take_up_to_10_bytes(native: ModuleType) -> None:
    """Varint values (kind, int64 attributes) are not limited to 5 bytes: a negative int64
    takes 10, and padding up to 10 is fine; 11 is refused."""
    span = _span(kind=-1)  # an open enum: any int32
    span.attributes.append(KeyValue(key="n", value=AnyValue(int_value=-(2**63))))
    compiled = _check_same(native, _body_with_span_bytes(span.SerializeToString()), LIMITS)
    assert compiled is not None
    assert compiled.spans[0].kind == -1 and compiled.spans[0].attributes == {"n": -(2**63)}
    for padding, accepted in ((9, True), (10, False)):  # kind = 2: 10, 11 bytes
        kind = wire.encode([wire.Field(6, wire.VARINT, 2, value_padding=padding)])
        body = _body_with_span_bytes(_span().SerializeToString() + kind)
        if accepted:
            compiled = _check_same(native, body, LIMITS)
            assert compiled is not None and compiled.spans[0].kind == 2
        else:
            _refused_by_both(native, body)


def _event(name: bytes, *extra: bytes) -> bytes:
    return wire.field(11, b"".join(extra) + wire.field(2, name))


def _kv(key: bytes, *earlier_keys: bytes, value: bytes = b"v") -> bytes:
    return b"".join(wire.field(1, k) for k in (*earlier_keys, key)) + wire.field(
        2, wire.field(1, value))


# Every singular string field the native decoder reads, sent twice: (where, span bytes
# after the fixed ones given the earlier copy, or a whole body where the string is outside
# the span). ``{}`` is the earlier copy.
_BAD = b"\xff"
_DUPLICATED_STRINGS: list[tuple[str, object]] = [
    ("span name", lambda c: wire.field(5, c) + wire.field(5, b"s")),
    ("event name", lambda c: _event(b"e", wire.field(2, c))),
    ("content event name (dropped)",
     lambda c: _event(b"gen_ai.user.message", wire.field(2, c))),
    ("event past the events limit", lambda c: _event(b"e") + _event(b"e", wire.field(2, c))),
    ("span attribute key", lambda c: wire.field(9, _kv(b"k", c))),
    ("content attribute key (dropped)", lambda c: wire.field(9, _kv(b"gen_ai.prompt", c))),
    ("event attribute key", lambda c: _event(b"e", wire.field(3, _kv(b"k", c)))),
    ("string value", lambda c: wire.field(9, wire.field(1, b"k") + wire.field(
        2, wire.field(1, c) + wire.field(1, b"v")))),
    ("trace state", lambda c: wire.field(3, c) + wire.field(3, b"")),
    ("status message", lambda c: wire.field(15, wire.field(2, c) + wire.field(2, b"m"))),
    ("link trace state", lambda c: wire.field(13, wire.field(3, c) + wire.field(3, b""))),
    ("link attribute key", lambda c: wire.field(13, wire.field(4, _kv(b"k", c)))),
]


def _duplicated_string_body(where: str, earlier: bytes) -> bytes:
    (build,) = [b for w, b in _DUPLICATED_STRINGS if w == where]
    span_bytes = _span().SerializeToString()
    return _body_with_span_bytes(span_bytes + build(earlier))  # type: ignore[operator]


@pytest.mark.parametrize("where", [w for w, _ in _DUPLICATED_STRINGS])
def test_every_copy_of_a_string_is_checked_for_utf8(native: ModuleType, where: str) -> None:
    """Protobuf keeps the last copy of a singular string but checks every copy: an earlier
    copy that is not UTF-8 refuses the request. With a valid earlier copy both decode."""
    _refused_by_both(native, _duplicated_string_body(where, _BAD))
    body = _duplicated_string_body(where, b"earlier")
    if where == "string value":  # two members of one AnyValue: left to the reference
        assert decode_native(body, LIMITS, native) is None
    else:
        assert _check_same(native, body, LIMITS) is not None


@pytest.mark.parametrize("where", ["resource attribute key", "scope name",
                                   "rejected span's name"])
def test_strings_outside_accepted_spans_are_checked_on_every_copy(
        native: ModuleType, where: str) -> None:
    def body_with(earlier: bytes) -> bytes:
        span = wire.field(2, _span().SerializeToString())
        if where == "resource attribute key":
            resource = wire.field(1, wire.field(1, _kv(b"service.name", earlier)))
            return wire.field(1, resource + wire.field(2, span))
        if where == "scope name":
            scope = wire.field(1, wire.field(1, earlier) + wire.field(1, b"scope"))
            return wire.field(1, wire.field(2, scope + span))
        rejected = _span(trace_id=bytes(16)).SerializeToString()  # a zero trace id
        return _body_with_span_bytes(rejected + wire.field(5, earlier) + wire.field(5, b"s"))

    _refused_by_both(native, body_with(_BAD))
    assert _check_same(native, body_with(b"earlier"), LIMITS) is not None


# --- hash flooding ------------------------------------------------------------------------


def test_siphash_is_cpythons_siphash13(native: ModuleType) -> None:
    """The tables' hash is SipHash-1-3 as CPython computes it (Python/pyhash.c): with
    PYTHONHASHSEED=0, CPython hashes bytes with it under an all-zero key."""
    import random
    import subprocess
    import sys

    rng = random.Random(7)
    samples = [rng.randbytes(n) for n in (*range(1, 40), 64, 100, 1000)]
    script = ("import sys\nfor line in sys.stdin:\n"
              "    print(hash(bytes.fromhex(line.strip())))\n")
    done = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                          text=True, env={"PYTHONHASHSEED": "0"},
                          input="".join(s.hex() + "\n" for s in samples))
    expected = [int(line) for line in done.stdout.split()]
    assert len(expected) == len(samples)
    for sample, cpython in zip(samples, expected, strict=True):
        mine = native._siphash13(bytes(16), sample)
        signed = mine - (1 << 64) if mine >= 1 << 63 else mine
        assert (-2 if signed == -1 else signed) == cpython, sample.hex()


def test_trace_ids_colliding_under_the_former_hash_cost_no_long_probes(
        native: ModuleType) -> None:
    """The ids of bench/hash_flood.py share all 64 bits of the fixed hash the decoder used
    before: in its table each one probed past every earlier one (work quadratic in the
    spans). Under the keyed hash they are as good as random: the longest lookup stays
    short, counted in slots rather than timed."""
    from bench.hash_flood import (
        colliding_trace_ids,
        old_fixed_hash,
        old_table_longest_probe,
        random_trace_ids,
        request_with_trace_ids,
    )

    ids = colliding_trace_ids(1000)
    assert len({old_fixed_hash(trace_id) for trace_id in ids}) == 1
    assert old_table_longest_probe(ids) == 1000  # the old problem: one run of every id
    assert old_table_longest_probe(random_trace_ids(1000)) < 100  # ... that random ids avoid
    compiled = _check_same(native, request_with_trace_ids(ids), LIMITS)
    assert compiled is not None and len(compiled.spans) == 1000
    assert native.longest_probe() < 100


def test_attribute_sets_colliding_under_the_former_hash_cost_no_long_probes(
        native: ModuleType) -> None:
    """Attribute sets are a table key too (their run of wire bytes): the same for them."""
    from bench.hash_flood import (
        ATTRIBUTE_KEY,
        attribute_run,
        colliding_attribute_values,
        old_fixed_hash,
        old_table_longest_probe,
    )

    values = colliding_attribute_values(1000)
    runs = [attribute_run(value) for value in values]
    assert len({old_fixed_hash(run) for run in runs}) == 1
    assert old_table_longest_probe(runs) == 1000
    spans = []
    for i, value in enumerate(values):
        span = _span(span_id=(i + 1).to_bytes(8, "little"))
        span.attributes.append(KeyValue(key=ATTRIBUTE_KEY, value=AnyValue(bytes_value=value)))
        assert attribute_run(value) in span.SerializeToString()
        spans.append(span)
    compiled = _check_same(native, export_request(spans).SerializeToString(), LIMITS)
    assert compiled is not None and len(compiled.spans) == 1000
    assert native.longest_probe() < 100


def test_probing_is_bounded_even_where_the_key_is_known(native: ModuleType) -> None:
    """A client that knew the key could choose colliding ids; it still cannot make a
    lookup look at more than PROBE_LIMIT slots: at that point the request is left to the
    reference decoder (linear). Here the key is set, and ids are picked whose hashes share
    their low 8 bits (the id table's first 256 slots): PROBE_LIMIT of them decode, the
    lookup of one more would look at PROBE_LIMIT + 1 slots. A fresh random key (as at
    import) makes the same ids harmless."""
    from bench.hash_flood import random_trace_ids, request_with_trace_ids

    key = bytes(range(16))
    limit = native.PROBE_LIMIT
    ids = [trace_id for trace_id in random_trace_ids(400 * (limit + 1), seed=3)
           if native._siphash13(key, trace_id) & 255 == 0][: limit + 1]
    assert len(ids) == limit + 1
    native._set_hash_key(key)
    try:
        compiled = _check_same(native, request_with_trace_ids(ids[:limit]), LIMITS)
        assert compiled is not None and native.longest_probe() == limit
        body = request_with_trace_ids(ids)
        assert decode_native(body, LIMITS, native) is None
        assert native.longest_probe() == limit + 1
        decoded, decoder = decode_trace_payload(body, "protobuf", LIMITS)
        assert decoder == DECODER_REFERENCE and len(decoded.spans) == limit + 1
    finally:
        native._set_hash_key(None)
    compiled = _check_same(native, body, LIMITS)
    assert compiled is not None and native.longest_probe() < limit // 2


# --- structure-aware differential fuzzing -----------------------------------------------


class _Drawn:
    """wire.Choices from hypothesis's data (so that failures shrink)."""

    def __init__(self, data: st.DataObject) -> None:
        self._data = data

    def integer(self, low: int, high: int) -> int:
        return self._data.draw(st.integers(low, high))


_COLLIDING_IDS: list[bytes] = []


def _colliding_ids() -> list[bytes]:
    if not _COLLIDING_IDS:
        from bench.hash_flood import colliding_trace_ids
        _COLLIDING_IDS.extend(colliding_trace_ids(64))
    return _COLLIDING_IDS


@settings(max_examples=500, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), request=trace_requests(),
       limits=st.sampled_from([LIMITS, TIGHT_LIMITS, KEEP_CONTENT]))
def test_structure_aware_mutations_decode_as_the_reference_or_are_left_to_it(
        native: ModuleType, data: st.DataObject, request: ExportTraceServiceRequest,
        limits: IngestLimits) -> None:
    """Fields duplicated, renumbered, sent with another wire type, with padded varints
    (past protobuf's limits too), AnyValues nested deep, ids colliding under the former
    hash, earlier copies that are not UTF-8 (testkit/support/otlp_wire.py): the compiled
    decoder returns the reference's answer (the same spans, values and counts) or leaves
    the request to it, and never accepts what protobuf refuses."""
    body = request.SerializeToString()
    choices = _Drawn(data)
    for _ in range(data.draw(st.integers(1, 4))):
        body = wire.mutate(body, choices, _colliding_ids())
    _check_same(native, body, limits)


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(depth=st.integers(1, 120), kinds=st.lists(st.integers(0, 1), min_size=1, max_size=3))
def test_deeply_nested_values_decode_as_the_reference_or_are_left_to_it(
        native: ModuleType, depth: int, kinds: list[int]) -> None:
    value = wire.nested(wire.field(1, b"leaf"), depth, kinds)
    span_bytes = _span().SerializeToString() + wire.field(9, wire.field(1, b"k")
                                                          + wire.field(2, value))
    _check_same(native, _body_with_span_bytes(span_bytes), LIMITS)
