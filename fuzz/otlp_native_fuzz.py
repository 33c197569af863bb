"""Coverage-guided differential fuzz target: the compiled trace decoder against protobuf's
parser and the reference decoder (atheris).

Each input is either a request body as it is (first byte even) or the choices of a few
structure-aware edits (testkit/support/otlp_wire.py: fields duplicated, renumbered, sent
with another wire type, padded varints, deep nesting, colliding ids, earlier copies that
are not UTF-8) applied to one of a few valid requests (first byte odd). The compiled
decoder must leave the body to the reference (None) or return exactly what it returns,
compared by repr (which tells 1 from 1.0 from True and shows NaN; the rejection reasons
in sorted order), and must never accept what protobuf refuses. ``make test`` runs it for
a fixed number of inputs (tests/collector/test_fuzz_atheris.py); by hand:

    .venv/bin/python fuzz/otlp_native_fuzz.py -max_total_time=600 fuzz/corpus-native
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testkit.support

# The modules the target reads, loaded by setup() (under atheris's instrumentation when
# fuzzing: only these, which keeps start-up short).
INSTRUMENTED = ("tokenpath.collector.receivers.otlp_decode", "testkit.support.otlp_wire")
_loaded: dict[str, Any] = {}


def setup() -> None:
    from bench.hash_flood import colliding_trace_ids
    from testkit.support import otlp_wire
    from tokenpath.collector.limits import IngestLimits
    from tokenpath.collector.receivers import otlp_decode

    _loaded.update(wire=otlp_wire, decode=otlp_decode, limits=IngestLimits(),
                   tight=IngestLimits(max_attributes_per_span=3,
                                      max_attribute_value_length=2, max_events_per_span=1),
                   ids=colliding_trace_ids(16), seeds=seed_requests())


def seed_requests() -> list[bytes]:
    """Valid requests with every field the decoder reads (and some it only checks)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    def kv(key: str, value: AnyValue) -> KeyValue:
        return KeyValue(key=key, value=value)

    nested = AnyValue()
    nested.array_value.values.extend([AnyValue(int_value=-1), AnyValue(string_value="é")])
    nested.array_value.values.add().kvlist_value.values.append(
        kv("inner", AnyValue(bool_value=True)))
    attributes = [kv("tokenpath.stage", AnyValue(string_value="kernels")),
                  kv("n", AnyValue(int_value=2**40)), kv("x", AnyValue(double_value=0.5)),
                  kv("b", AnyValue(bytes_value=b"\x00\x01")), kv("list", nested),
                  kv("gen_ai.prompt", AnyValue(string_value="secret"))]
    span = Span(trace_id=bytes(range(1, 17)), span_id=bytes(range(1, 9)),
                parent_span_id=bytes(range(2, 10)), name="span", kind=2,  # type: ignore[arg-type]
                start_time_unix_nano=10, end_time_unix_nano=20, trace_state="t=1",
                flags=0x300)
    span.attributes.extend(attributes)
    event = span.events.add(name="tokenpath.stage", time_unix_nano=15)
    event.attributes.extend(attributes[:2])
    span.events.add(name="gen_ai.user.message", time_unix_nano=16)
    link = span.links.add(trace_id=bytes(range(3, 19)), span_id=bytes(range(3, 11)))
    link.attributes.extend(attributes[:1])
    span.status.code = 2  # type: ignore[assignment]
    span.status.message = "failed"
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.extend(attributes[:2])
    scope_spans = resource_spans.scope_spans.add()
    scope_spans.scope.name = "scope"
    scope_spans.spans.append(span)
    scope_spans.spans.add(trace_id=bytes(16), span_id=bytes(range(1, 9)), name="rejected")
    other = scope_spans.spans.add()
    other.CopyFrom(span)
    other.span_id = bytes(range(9, 17))
    small = ExportTraceServiceRequest()
    small.resource_spans.add().scope_spans.add().spans.add(
        trace_id=bytes(range(1, 17)), span_id=bytes(range(1, 9)), name="s")
    return [request.SerializeToString(), small.SerializeToString()]


def _canonical(decoded: Any) -> str:
    """A decoded request as compared: its repr, the rejection reasons in sorted order
    (the reference counts them in the order it meets them, the native decoder in a fixed
    one; the error message and the counters do not depend on it)."""
    return repr(replace(decoded, rejection_reasons=dict(sorted(
        decoded.rejection_reasons.items()))))


def _reference(body: bytes, limits: object) -> object | None:
    decode: ModuleType = _loaded["decode"]
    try:
        decoded: object = decode.decode_traces(decode.parse_trace_request(body, "protobuf"),
                                               limits)
    except decode.MalformedPayload:
        return None
    return decoded


def test_one_input(data: bytes) -> None:
    if not _loaded:
        setup()
    wire: ModuleType = _loaded["wire"]
    decode: ModuleType = _loaded["decode"]
    if not data or data[0] % 2 == 0:
        body = data[1:]
    else:
        choices = wire.ByteChoices(data[1:])
        seeds: list[bytes] = _loaded["seeds"]
        body = seeds[choices.integer(0, len(seeds) - 1)]
        for _ in range(choices.integer(1, 4)):
            body = wire.mutate(body, choices, _loaded["ids"])
    for limits in (_loaded["limits"], _loaded["tight"]):
        compiled = decode.decode_native(body, limits)
        if compiled is None:
            continue
        reference = _reference(body, limits)
        if reference is None:
            raise AssertionError(f"the native decoder accepted what protobuf refuses: "
                                 f"{body.hex()}")
        if _canonical(compiled) != _canonical(reference):
            raise AssertionError(f"the native decoder differs from the reference: "
                                 f"{body.hex()}")


def main() -> None:
    import atheris  # type: ignore[import-not-found, unused-ignore]

    with atheris.instrument_imports(include=list(INSTRUMENTED)):
        setup()
    if not _loaded["decode"].native_decoder_available():
        sys.exit("the native decoder is not built: nothing to compare")
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
