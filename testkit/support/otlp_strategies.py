"""Hypothesis strategies for OTLP trace export requests: valid ones (every field the
protobuf schema has, with ids of wrong lengths, content attributes, nested values) and
byte-level mutations of them. Shared by the receivers' fuzz tests and the compiled
decoder's equivalence tests."""

from __future__ import annotations

from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tokenpath import attributes as A
from tokenpath.stages import StageId

_KEYS = st.sampled_from([A.STAGE, A.STAGE_SECONDS, A.PHASE, A.PROVENANCE,
                         A.GEN_AI_REQUEST_MODEL, A.GEN_AI_USAGE_INPUT_TOKENS,
                         A.GEN_AI_USAGE_OUTPUT_TOKENS, A.TTFT_SECONDS, A.PREFIX_FINGERPRINTS,
                         A.VLLM_LATENCY_TIME_IN_MODEL_PREFILL, A.GEN_AI_REQUEST_ID,
                         A.SIMULATED, A.TENSOR_PARALLEL, "http.route", "gen_ai.prompt"]) | st.text(
    max_size=12)
_SCALARS = st.one_of(
    st.builds(lambda v: AnyValue(string_value=v),
              st.sampled_from([s.value for s in StageId]) | st.text(max_size=20)),
    st.builds(lambda v: AnyValue(int_value=v), st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda v: AnyValue(double_value=v), st.floats(allow_nan=True)),
    st.builds(lambda v: AnyValue(bool_value=v), st.booleans()),
    st.builds(lambda v: AnyValue(bytes_value=v), st.binary(max_size=8)),
)


def _array(values: list[AnyValue]) -> AnyValue:
    out = AnyValue()
    out.array_value.values.extend(values)
    return out


def _kvlist(pairs: list[tuple[str, AnyValue]]) -> AnyValue:
    out = AnyValue()
    out.kvlist_value.values.extend(KeyValue(key=k, value=v) for k, v in pairs)
    return out


_VALUES = st.recursive(_SCALARS, lambda inner: st.builds(_array, st.lists(inner, max_size=3))
                       | st.builds(_kvlist, st.lists(st.tuples(st.text(max_size=5), inner),
                                                     max_size=3)), max_leaves=6)
_ATTRS = st.lists(st.builds(lambda k, v: KeyValue(key=k, value=v), _KEYS, _VALUES), max_size=6)
_IDS16 = st.binary(min_size=16, max_size=16) | st.binary(max_size=20) | st.just(bytes(16))
_IDS8 = st.binary(min_size=8, max_size=8) | st.binary(max_size=10) | st.just(bytes(8))
_TIMES = st.integers(0, 2**64 - 1)


@st.composite
def spans(draw: st.DrawFn, trace_ids: list[bytes]) -> Span:
    span = Span(trace_id=draw(st.sampled_from(trace_ids) | _IDS16), span_id=draw(_IDS8),
                parent_span_id=draw(st.just(b"") | _IDS8),
                name=draw(st.sampled_from([A.VLLM_REQUEST_SPAN_NAME,
                                           A.SPAN_REQUEST_ANNOTATION, "x"])
                          | st.text(max_size=10)),
                kind=draw(st.integers(0, 5)),  # type: ignore[arg-type]
                start_time_unix_nano=draw(_TIMES), end_time_unix_nano=draw(_TIMES))
    span.attributes.extend(draw(_ATTRS))
    for _ in range(draw(st.integers(0, 2))):
        event = span.events.add()
        event.name = draw(st.sampled_from([A.STAGE_EVENT, "gen_ai.user.message", "e"]))
        event.time_unix_nano = draw(_TIMES)
        event.attributes.extend(draw(_ATTRS))
    # What the pipeline does not read, but a decoder must still parse and check.
    if draw(st.booleans()):
        span.status.code = draw(st.integers(0, 2))  # type: ignore[assignment]
        span.status.message = draw(st.text(max_size=8))
    span.flags = draw(st.sampled_from([0, 0x100, 0x300, 0x301]) | st.integers(0, 2**32 - 1))
    span.trace_state = draw(st.just("") | st.text(max_size=8))
    for _ in range(draw(st.integers(0, 1))):
        link = span.links.add(trace_id=draw(_IDS16), span_id=draw(_IDS8),
                              trace_state=draw(st.text(max_size=4)))
        link.attributes.extend(draw(_ATTRS))
    span.dropped_attributes_count = draw(st.integers(0, 3))
    return span


@st.composite
def trace_requests(draw: st.DrawFn) -> ExportTraceServiceRequest:
    trace_ids = draw(st.lists(st.binary(min_size=16, max_size=16), min_size=1, max_size=3))
    request = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(0, 2))):
        resource_spans = request.resource_spans.add()
        resource_spans.resource.attributes.extend(draw(_ATTRS))
        scope = resource_spans.scope_spans.add()
        scope.scope.name = draw(st.text(max_size=8))
        scope.scope.attributes.extend(draw(_ATTRS))
        scope.spans.extend(draw(st.lists(spans(trace_ids), max_size=4)))
    return request


# --- mutations -------------------------------------------------------------------------


@st.composite
def mutated_bytes(draw: st.DrawFn, base: bytes) -> bytes:
    data = bytearray(base)
    for _ in range(draw(st.integers(1, 4))):
        choice = draw(st.integers(0, 3))
        at = draw(st.integers(0, len(data)))
        if choice == 0 and data:
            data[min(at, len(data) - 1)] = draw(st.integers(0, 255))
        elif choice == 1:
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif choice == 2:
            del data[at:at + draw(st.integers(1, 8))]
        else:
            data = data[:at]
    return bytes(data)
