"""Engine hooks: the engine span joins its caller's trace however the headers arrive."""

from __future__ import annotations

from typing import Any

import pytest

from testkit.fakes.otel_sink import SpanSink
from tokenpath.instrumentation.engine_trace import EngineIdentity, EngineRequestTrace, get_tracer
from tokenpath.instrumentation.safety import telemetry_errors

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
CALLER_TRACE_ID = TRACEPARENT.split("-")[1]
IDENTITY = EngineIdentity(model="m", engine="e", replica="r", node="n", pool="p",
                          gpu_type="H100")


def _request(sink: SpanSink, headers: dict[str, Any] | None) -> EngineRequestTrace:
    return EngineRequestTrace(tracer=get_tracer(sink.provider), identity=IDENTITY,
                              request_id="r1", prompt_tokens=3, max_tokens=3,
                              trace_headers=headers)


@pytest.mark.parametrize("headers", [
    {"traceparent": TRACEPARENT},
    {"Traceparent": TRACEPARENT},  # a case-preserving header map
    {"TRACEPARENT": TRACEPARENT.encode()},  # raw header bytes
])
def test_the_engine_span_joins_the_callers_trace(headers: dict[str, Any]) -> None:
    sink = SpanSink()
    telemetry_errors.reset()
    request = _request(sink, headers)
    assert request.trace_id == CALLER_TRACE_ID
    assert request.finish(request.arrival + 0.01, 1) == CALLER_TRACE_ID
    (span,) = sink.spans()
    assert format(span.context.trace_id, "032x") == CALLER_TRACE_ID
    assert span.parent is not None and format(span.parent.span_id, "016x") == "b7ad6b7169203331"
    assert telemetry_errors.total() == 0


@pytest.mark.parametrize("headers", [
    None, {}, {"traceparent": "garbage"}, {"traceparent": 42}, {7: b"\xff\xfe"},
])
def test_missing_or_unreadable_headers_start_a_trace_and_never_raise(
        headers: dict[Any, Any] | None) -> None:
    sink = SpanSink()
    request = _request(sink, headers)
    assert request.trace_id is None
    # Ended where an unrelated span is current (an engine loop task started inside
    # another request's context): the engine span still starts a trace of its own.
    with get_tracer(sink.provider).start_as_current_span("unrelated") as unrelated:
        emitted = request.finish(request.arrival + 0.01, 1)
    engine = next(s for s in sink.spans() if s.name != "unrelated")
    assert emitted == format(engine.context.trace_id, "032x") != CALLER_TRACE_ID
    assert engine.parent is None
    assert engine.context.trace_id != unrelated.get_span_context().trace_id
