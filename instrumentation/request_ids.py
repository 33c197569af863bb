"""Engine request ids that carry their request's trace: ``tp-<trace id>-<span id>``.

vLLM takes a request's id from the ``X-Request-Id`` header it is sent
(``chatcmpl-<header>``) and hands stat-logger plugins that id but no trace context. A
gateway that sends :func:`request_id_for` of its span lets tokenpath's vLLM plugin put the
request's annotation span into the request's own trace (:func:`trace_of`), so routing by
trace id (the OpenTelemetry Collector's ``loadbalancing`` exporter) sends the annotation to
the collector replica that holds the request. Without it the annotation starts a trace of
its own and joins its request only on a single collector.
"""

from __future__ import annotations

import re

from opentelemetry.trace import SpanContext

REQUEST_ID_HEADER = "X-Request-Id"
REQUEST_ID_PREFIX = "tp-"
_TRACE_IN_REQUEST_ID = re.compile(REQUEST_ID_PREFIX + r"([0-9a-f]{32})-([0-9a-f]{16})")


def request_id_for(context: SpanContext) -> str | None:
    """The engine request id naming ``context``'s trace and span; None for an invalid one."""
    if not context.is_valid:
        return None
    return f"{REQUEST_ID_PREFIX}{context.trace_id:032x}-{context.span_id:016x}"


def trace_of(request_id: str) -> tuple[int, int] | None:
    """(trace id, span id) that :func:`request_id_for` put in ``request_id`` (the engine may
    wrap it, as vLLM's ``chatcmpl-`` prefix); None when it holds none, or only zeros."""
    match = _TRACE_IN_REQUEST_ID.search(request_id)
    if match is None:
        return None
    trace_id, span_id = int(match.group(1), 16), int(match.group(2), 16)
    if not trace_id or not span_id:
        return None
    return trace_id, span_id
