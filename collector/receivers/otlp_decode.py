"""OTLP payloads (protobuf or OTLP/JSON) into the collector's SpanData and metric points.

Both receivers share this: they differ only in transport. Malformed payloads raise
:class:`MalformedPayload` (HTTP 400 / gRPC INVALID_ARGUMENT); spans that are well formed
but refused (bad id lengths) are counted in :class:`DecodedSpans.rejected`, as the OTLP
partial-success response requires.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
from dataclasses import dataclass, field, fields
from types import ModuleType
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1 import trace_pb2

from tokenpath import install_check
from tokenpath.attributes import GEN_AI_CONTENT_EVENT_NAMES, GEN_AI_CONTENT_PREFIXES
from tokenpath.collector.limits import IngestLimits
from tokenpath.collector.spans import Attributes, AttrValue, SpanData, SpanEvent


class MalformedPayload(ValueError):
    """The payload cannot be decoded at all."""


@dataclass(slots=True)
class DecodedSpans:
    spans: list[SpanData] = field(default_factory=list)
    rejected: int = 0
    rejection_reasons: dict[str, int] = field(default_factory=dict)
    attributes_dropped: int = 0
    content_attributes_dropped: int = 0
    values_truncated: int = 0
    events_dropped: int = 0
    content_events_dropped: int = 0

    def reject(self, reason: str, n: int = 1) -> None:
        if n <= 0:
            return
        self.rejected += n
        self.rejection_reasons[reason] = self.rejection_reasons.get(reason, 0) + n

    @property
    def error_message(self) -> str:
        if not self.rejected:
            return ""
        parts = ", ".join(f"{n} {reason}" for reason, n in sorted(self.rejection_reasons.items()))
        return f"rejected {self.rejected} spans: {parts}"

    @property
    def warning_message(self) -> str:
        """Limits applied to accepted spans (sent with rejected_spans = 0)."""
        parts = [f"{n} {what}" for n, what in (
            (self.attributes_dropped, "attributes dropped (attributes per span)"),
            (self.values_truncated, "attribute values truncated (value length)"),
            (self.events_dropped, "span events dropped (events per span)"),
        ) if n]
        return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class MetricPoint:
    """One number from an OTLP metric: a gauge value or a cumulative sum."""

    name: str
    value: float
    time_unix_nano: int
    attributes: Attributes
    resource: Attributes
    monotonic: bool


# --- attribute values ------------------------------------------------------------------


# Strings up to this length are shared within one export request: attribute keys, stage
# ids, model names, span names and the ids that spans of one trace repeat. Buffered spans
# then hold references instead of copies (bench/memory.py measures the effect).
SHARED_STRING_MAX_LENGTH = 64
_NO_ATTRIBUTES: Attributes = {}  # shared by every span without attributes; never modified
_CONTENT_KEY = "\x00gen_ai content"  # marks a dropped key in _AttributeReader.keys
_ZERO_TRACE_ID = bytes(16)
_ZERO_SPAN_ID = bytes(8)


class _AttributeReader:
    """Converts KeyValue lists under the ingest limits, counting what it drops."""

    __slots__ = ("content_dropped", "dropped", "keys", "limits", "shared", "shared_attributes",
                 "shared_ints", "truncated")

    def __init__(self, limits: IngestLimits) -> None:
        self.limits = limits
        self.dropped = 0
        self.content_dropped = 0
        self.truncated = 0
        self.shared: dict[str, str] = {}
        self.shared_ints: dict[int, int] = {}
        self.shared_attributes: dict[tuple[object, ...], Attributes] = {}
        # Each attribute key seen in this request: the key to store (shared), or
        # _CONTENT_KEY for a GenAI content attribute that is dropped. Keys repeat across
        # the spans and events of a request, so each is checked once.
        self.keys: dict[str, str] = {}

    def _admit_key(self, key: str) -> str:
        if not self.limits.keep_content_attributes and key.startswith(GEN_AI_CONTENT_PREFIXES):
            admitted = _CONTENT_KEY
        elif len(key) <= SHARED_STRING_MAX_LENGTH:
            admitted = self.shared.setdefault(key, key)
        else:
            admitted = key
        self.keys[key] = admitted
        return admitted

    def share(self, text: str) -> str:
        """One object per distinct short string in this request."""
        if len(text) > SHARED_STRING_MAX_LENGTH:
            return text
        return self.shared.setdefault(text, text)

    def share_int(self, number: int) -> int:
        """One object per distinct integer value (small ints are shared by Python itself)."""
        return self.shared_ints.setdefault(number, number)

    def value(self, v: AnyValue) -> AttrValue | None:
        which = v.WhichOneof("value")
        if which == "string_value":
            s = v.string_value
            if len(s) > self.limits.max_attribute_value_length:  # strings: characters
                self.truncated += 1
                s = s[: self.limits.max_attribute_value_length]
            return self.share(s)
        if which == "int_value":
            return self.share_int(v.int_value)
        if which == "double_value":
            return v.double_value
        if which == "bool_value":
            return v.bool_value
        if which == "array_value":
            values = v.array_value.values
            cap = self.limits.max_attribute_value_length  # arrays: items
            if len(values) > cap:
                self.truncated += 1
            items = [self.value(item) for item in values[:cap]]
            return tuple(item for item in items if item is not None)
        if which == "bytes_value":
            raw = v.bytes_value
            if 2 * len(raw) > self.limits.max_attribute_value_length:
                self.truncated += 1
                raw = raw[: self.limits.max_attribute_value_length // 2]
            return raw.hex()
        return None  # kvlist and empty values carry nothing the pipeline reads

    def read(self, kvs: Any) -> Attributes:
        if not kvs:
            return _NO_ATTRIBUTES
        out: Attributes = {}
        limit = self.limits.max_attributes_per_span
        max_length = self.limits.max_attribute_value_length
        shared = self.shared
        shared_ints = self.shared_ints
        keys = self.keys
        kinds = 1  # a leading 1 digit, then one base-4 digit per value stored
        stored = 0
        shareable = True
        for kv in kvs:
            raw_key = kv.key
            key = keys.get(raw_key) or self._admit_key(raw_key)
            if key is _CONTENT_KEY:
                self.content_dropped += 1
                continue
            if len(out) >= limit:
                self.dropped += 1
                continue
            v = kv.value
            # The common cases inline (a short string, a number); the rest through value().
            which = v.WhichOneof("value")
            if which == "string_value":
                text = v.string_value
                if len(text) > max_length:
                    self.truncated += 1
                    text = text[:max_length]
                value: AttrValue | None = (
                    shared.setdefault(text, text) if len(text) <= SHARED_STRING_MAX_LENGTH
                    else text)
                kind = 0
            elif which == "double_value":
                value = v.double_value
                kind = 1
            elif which == "int_value":
                number = v.int_value
                value = shared_ints.setdefault(number, number)
                kind = 2
            else:  # bool, bytes, array
                value = self.value(v)
                kind = 3
                if isinstance(value, tuple):
                    shareable = False
            if value is not None:
                out[key] = value
                kinds = kinds * 4 + kind
                stored += 1
        if not out:
            return _NO_ATTRIBUTES
        # Spans of one request often carry the same attribute set (route, stage, phase):
        # they share one dict. Attribute dicts are never modified after decoding. As
        # 1 == 1.0 == True, the key also holds ``kinds``, the kind of each value in order
        # (string, float, int, other: a base-4 number), so a span is never given an equal
        # value of another type. Sets with an array (whose items could differ the same
        # way) or a repeated key (``kinds`` then has a digit too many) are not shared.
        if not shareable or len(out) != stored:
            return out
        return self.shared_attributes.setdefault((kinds, *out.items()), out)


# --- traces ------------------------------------------------------------------------------


def _parse_into(body: bytes, content_type: str, message: Any) -> None:
    """Protobuf or OTLP/JSON into ``message``; :class:`MalformedPayload` when neither."""
    if content_type == "json":
        _parse_json_into(body, message)
        return
    try:
        message.ParseFromString(body)
    except (DecodeError, ValueError) as exc:
        raise MalformedPayload(f"invalid OTLP protobuf: {exc}") from exc


def parse_trace_request(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    message = ExportTraceServiceRequest()
    _parse_into(body, content_type, message)
    return message


def decode_traces(message: ExportTraceServiceRequest, limits: IngestLimits) -> DecodedSpans:
    out = DecodedSpans()
    reader = _AttributeReader(limits)
    max_events = limits.max_events_per_span
    share = reader.share
    read = reader.read
    spans = out.spans
    for resource_spans in message.resource_spans:
        resource = read(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                trace_id = span.trace_id
                span_id = span.span_id
                parent = span.parent_span_id
                if len(trace_id) != 16 or trace_id == _ZERO_TRACE_ID:
                    out.reject("invalid trace_id")
                    continue
                if len(span_id) != 8 or span_id == _ZERO_SPAN_ID:
                    out.reject("invalid span_id")
                    continue
                if parent and len(parent) != 8:
                    out.reject("invalid parent_span_id")
                    continue
                start = span.start_time_unix_nano
                end = span.end_time_unix_nano
                spans.append(
                    SpanData(
                        share(trace_id.hex()),
                        span_id.hex(),
                        share(parent.hex()) if parent and parent != _ZERO_SPAN_ID else "",
                        share(span.name),
                        span.kind,
                        start,
                        end if end > start else start,
                        read(span.attributes),
                        _read_events(span.events, reader, max_events, out)
                        if span.events else (),
                        resource,
                        span.status.code,
                        span.flags & _REMOTE_PARENT_FLAGS == _REMOTE_PARENT_FLAGS,
                    )
                )
    out.attributes_dropped = reader.dropped
    out.content_attributes_dropped = reader.content_dropped
    out.values_truncated = reader.truncated
    return out


# --- the native decoder -------------------------------------------------------------------

# Set to "python" to decode with the pure-Python reference only (comparisons, debugging).
DECODER_ENV = install_check.DECODER_ENV
_SPAN_FIELDS = ("trace_id", "span_id", "parent_span_id", "name", "kind", "start_unix_nano",
                "end_unix_nano", "attributes", "events", "resource", "status_code",
                "remote_parent")
_EVENT_FIELDS = ("name", "time_unix_nano", "attributes")
# The reasons the native decoder counts, in the order it returns them.
_NATIVE_REJECTION_REASONS = ("invalid trace_id", "invalid span_id", "invalid parent_span_id")


def _load_native() -> ModuleType | None:
    """The C extension built by the package's setup.py (collector/receivers/
    _otlp_native.c), or None where it was not built, is switched off or failed the
    install's check (tokenpath/install_check.py)."""
    if not install_check.decoder_usable():
        return None
    try:
        from tokenpath.collector.receivers import _otlp_native
    except ImportError:
        return None
    module: ModuleType = _otlp_native
    return module


_native = _load_native()


def native_decoder_available() -> bool:
    return _native is not None


@functools.lru_cache(maxsize=16)
def native_config(limits: IngestLimits) -> tuple[object, ...]:
    """What the native decoder needs of the limits and the span classes, built once."""
    if tuple(f.name for f in fields(SpanData)) != _SPAN_FIELDS or tuple(
            f.name for f in fields(SpanEvent)) != _EVENT_FIELDS:
        raise RuntimeError("SpanData or SpanEvent changed: update _otlp_native.c and the "
                           "field lists in otlp_decode.py together")
    return (limits.max_attributes_per_span, limits.max_attribute_value_length,
            limits.max_events_per_span, limits.keep_content_attributes,
            tuple(prefix.encode() for prefix in GEN_AI_CONTENT_PREFIXES),
            frozenset(GEN_AI_CONTENT_EVENT_NAMES), SpanData, SpanEvent, _SPAN_FIELDS,
            _EVENT_FIELDS, _NO_ATTRIBUTES, ())


def decode_native(body: bytes, limits: IngestLimits,
                  native: ModuleType | None = None) -> DecodedSpans | None:
    """The native decoder's result, or None where the reference must decide (a payload
    it does not decode exactly as protobuf does, or no native decoder)."""
    module = native if native is not None else _native
    if module is None:
        return None
    result = module.decode_traces(body, native_config(limits))
    if result is None:
        return None
    out = DecodedSpans(result[0])
    for reason, n in zip(_NATIVE_REJECTION_REASONS, result[1:4], strict=True):
        out.reject(reason, n)
    (out.attributes_dropped, out.content_attributes_dropped, out.values_truncated,
     out.events_dropped, out.content_events_dropped) = result[4:9]
    return out


DECODER_COMPILED = "compiled"
DECODER_REFERENCE = "reference"


def decode_trace_payload(body: bytes, content_type: str, limits: IngestLimits
                         ) -> tuple[DecodedSpans, str]:
    """An export request's body decoded under the limits, and the decoder that did it:
    the compiled one where it is built and the payload is protobuf it decodes exactly,
    else protobuf's parser and :func:`decode_traces` (which raise :class:`MalformedPayload`)."""
    if content_type != "json":
        decoded = decode_native(body, limits)
        if decoded is not None:
            return decoded, DECODER_COMPILED
    return decode_traces(parse_trace_request(body, content_type), limits), DECODER_REFERENCE


# OTLP span flags (trace.proto's SpanFlags): whether the parent's remoteness is known, and
# that it is remote (the span continues a trace another process started: a local root).
# The C decoder (_otlp_native.c, REMOTE_PARENT_FLAGS) reads the same two bits.
_REMOTE_PARENT_FLAGS = (trace_pb2.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
                        | trace_pb2.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK)


def _read_events(raw_events: Any, reader: _AttributeReader, max_events: int,
                 out: DecodedSpans) -> list[SpanEvent]:
    events: list[SpanEvent] = []
    keep_content = reader.limits.keep_content_attributes
    for ev in raw_events:
        if not keep_content and ev.name in GEN_AI_CONTENT_EVENT_NAMES:
            out.content_events_dropped += 1
            continue
        if len(events) >= max_events:
            out.events_dropped += 1
            continue
        events.append(SpanEvent(ev.name, ev.time_unix_nano, reader.read(ev.attributes)))
    return events


# --- metrics -----------------------------------------------------------------------------


def parse_logs_request(body: bytes, content_type: str) -> ExportLogsServiceRequest:
    message = ExportLogsServiceRequest()
    _parse_into(body, content_type, message)
    return message


def parse_metrics_request(body: bytes, content_type: str) -> ExportMetricsServiceRequest:
    message = ExportMetricsServiceRequest()
    _parse_into(body, content_type, message)
    return message


def decode_metrics(message: ExportMetricsServiceRequest, limits: IngestLimits) -> list[MetricPoint]:
    reader = _AttributeReader(limits)
    points: list[MetricPoint] = []
    for resource_metrics in message.resource_metrics:
        resource = reader.read(resource_metrics.resource.attributes)
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                which = metric.WhichOneof("data")
                if which == "gauge":
                    data_points, monotonic = metric.gauge.data_points, False
                elif which == "sum":
                    data_points, monotonic = metric.sum.data_points, metric.sum.is_monotonic
                else:
                    continue  # histograms and summaries are not used by attribution
                for dp in data_points:
                    value = dp.as_double if dp.WhichOneof("value") == "as_double" else dp.as_int
                    points.append(
                        MetricPoint(
                            name=metric.name,
                            value=float(value),
                            time_unix_nano=dp.time_unix_nano,
                            attributes=reader.read(dp.attributes),
                            resource=resource,
                            monotonic=monotonic,
                        )
                    )
    return points


# --- OTLP/JSON -----------------------------------------------------------------------------

_ID_FIELDS = frozenset({"traceId", "spanId", "parentSpanId"})


def _hex_ids_to_base64(node: Any) -> Any:
    """OTLP/JSON carries trace and span ids as hex; protobuf's JSON mapping wants base64."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key in _ID_FIELDS and isinstance(value, str):
                try:
                    raw = bytes.fromhex(value)
                except ValueError:
                    raw = b"\x00"  # wrong length on purpose: the span is rejected, not the batch
                out[key] = base64.b64encode(raw).decode("ascii")
            else:
                out[key] = _hex_ids_to_base64(value)
        return out
    if isinstance(node, list):
        return [_hex_ids_to_base64(item) for item in node]
    return node


def _parse_json_into(body: bytes, message: Any) -> None:
    try:
        document = json.loads(body) if body.strip() else {}
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedPayload(f"invalid JSON: {exc}") from exc
    except RecursionError as exc:
        raise MalformedPayload("invalid JSON: nested too deeply") from exc
    if not isinstance(document, dict):
        raise MalformedPayload("OTLP/JSON body must be an object")
    try:
        json_format.ParseDict(_hex_ids_to_base64(document), message, ignore_unknown_fields=True)
    except (json_format.ParseError, binascii.Error, TypeError, ValueError) as exc:
        raise MalformedPayload(f"invalid OTLP/JSON: {exc}") from exc
    except RecursionError as exc:
        raise MalformedPayload("invalid OTLP/JSON: nested too deeply") from exc

