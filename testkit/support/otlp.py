"""Build OTLP export requests (protobuf and OTLP/JSON) and read /metrics in tests."""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from prometheus_client.parser import text_string_to_metric_families

from tokenpath import attributes as A
from tokenpath.otlp_values import key_values
from tokenpath.stages import StageId

_counter = itertools.count(1)


def new_trace_id() -> bytes:
    return os.urandom(8) + next(_counter).to_bytes(8, "big")


def new_span_id() -> bytes:
    return next(_counter).to_bytes(4, "big") + os.urandom(4)


def make_span(trace_id: bytes, span_id: bytes | None = None, parent: bytes = b"",
              name: str = "span", attrs: Mapping[str, Any] | None = None,
              start_ns: int | None = None, duration_ns: int = 10_000_000,
              events: Iterable[tuple[str, Mapping[str, Any]]] = (), kind: int = 1) -> Span:
    start = time.time_ns() if start_ns is None else start_ns
    span = Span(trace_id=trace_id, span_id=span_id or new_span_id(), parent_span_id=parent,
                name=name, kind=kind,  # type: ignore[arg-type]
                start_time_unix_nano=start, end_time_unix_nano=start + duration_ns)
    span.attributes.extend(key_values(attrs or {}))
    for event_name, event_attrs in events:
        event = span.events.add()
        event.name = event_name
        event.time_unix_nano = start
        event.attributes.extend(key_values(event_attrs))
    return span


def request_span(trace_id: bytes | None = None, model: str = "model-a",
                 attrs: Mapping[str, Any] | None = None, **kwargs: Any) -> Span:
    """A root span that is a request on its own (carries a stage)."""
    return make_span(trace_id or new_trace_id(), name="request",
                     attrs={A.STAGE: StageId.ROUTER.value, A.GEN_AI_REQUEST_MODEL: model,
                            **(attrs or {})}, **kwargs)


def export_request(spans: Iterable[Span], resource: Mapping[str, Any] | None = None
                   ) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.extend(key_values(resource or {}))
    resource_spans.scope_spans.add().spans.extend(spans)
    return request


_ID_KEYS = ("traceId", "spanId", "parentSpanId")


def _ids_to_hex(node: Any) -> Any:
    import base64

    if isinstance(node, dict):
        return {k: (base64.b64decode(v).hex() if k in _ID_KEYS and isinstance(v, str)
                    else _ids_to_hex(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_ids_to_hex(v) for v in node]
    return node


def to_otlp_json_dict(request: ExportTraceServiceRequest) -> dict[str, Any]:
    """OTLP/JSON: protobuf JSON mapping with hex trace and span ids."""
    return dict(_ids_to_hex(json_format.MessageToDict(request)))


def to_otlp_json(request: ExportTraceServiceRequest) -> bytes:
    return json.dumps(to_otlp_json_dict(request)).encode()


PROTOBUF_HEADERS = {"Content-Type": "application/x-protobuf"}
JSON_HEADERS = {"Content-Type": "application/json"}


def metric_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def sample(text: str, name: str, **labels: str) -> float:
    """One sample's value from exposition text (0 when absent)."""
    return metric_samples(text).get((name, tuple(sorted(labels.items()))), 0.0)
