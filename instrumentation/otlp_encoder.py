"""OTLP trace export bytes written straight from SDK spans (no protobuf message objects).

:func:`encode_export_request` returns the serialized ``ExportTraceServiceRequest`` for a
batch of OpenTelemetry SDK ``ReadableSpan`` objects: the same bytes, byte for byte, as
the OpenTelemetry exporters' ``encode_spans(spans).SerializePartialToString()`` (fuzzed
against it in ``tests/instrumentation/test_otlp_encoder.py``), at a fraction of the CPU.
The stock encoder builds a protobuf message object per span, event, attribute and value
and then serializes the tree; this one writes each field's bytes once, encodes a
batch's resource and scope once per group, and keeps the encoded forms of what repeats
from batch to batch (attribute keys, their short string values, span and event names).

It runs compiled (mypyc, ``tokenpath/compiled.py``) where the package was built with
its compiled core, and as plain Python otherwise; docs/performance.md has the figures.

The stock encoder's rules, kept here:

- spans are grouped by resource, then by instrumentation scope (``None`` for none), in
  the order each first appears; equal resources (and scopes) share one group;
- attribute values: ``None`` is an empty ``AnyValue``; ``bool`` before ``int``;
  ``str``, ``int`` (int64), ``float``, ``bytes``, sequences (arrays) and mappings
  (key-value lists, keys through ``str``); a value that cannot be encoded (another
  type, an int outside int64, a string that is not valid Unicode) drops that one
  attribute, with a log line, as the stock encoder does;
- span flags carry "has is_remote" and, for a remote parent, "is remote"; links carry
  their context's flags and no trace state; the status is always written.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence
from typing import Any, Final

logger = logging.getLogger(__name__)

# Wire types (protobuf encoding): varint, 64-bit, length-delimited, 32-bit.
_VARINT: Final = 0
_FIXED64: Final = 1
_LEN: Final = 2
_FIXED32: Final = 5

_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1
_UINT64: Final = 1 << 64

# SpanFlags (trace.proto): the parent's is_remote is known; the parent is remote. Literal
# values here (mypyc folds them); tests/instrumentation checks them against
# trace_pb2.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK and SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK.
_FLAG_HAS_IS_REMOTE: Final = 0x100
_FLAG_IS_REMOTE: Final = 0x200

# Each attribute key's encoded forms are kept (keys repeat across a batch); the cache is
# emptied when it grows past this many keys (and the span and event name caches past
# this many names), so that a stream of unique keys cannot grow it without bound; keys
# longer than CACHED_KEY_CHARS are encoded each time. So the caches hold at most 1,024
# keys of up to 128 characters with up to 32 string values each of up to 64 characters
# and 32 int values. They are shared
# by every thread that encodes; each read and write is one dictionary operation under
# the interpreter lock, and a key encoded twice by a race is encoded the same.
KEY_CACHE_LIMIT: Final = 1024
CACHED_KEY_CHARS: Final = 128

_ONE_BYTE: Final[tuple[bytes, ...]] = tuple(bytes((n,)) for n in range(128))
_pack_double = struct.Struct("<d").pack


def _tag(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


def _varint(value: int) -> bytes:
    """Unsigned varint of ``value`` (a negative int64 as its two's complement)."""
    if 0 <= value < 128:
        return _ONE_BYTE[value]
    if value < 0:
        value += _UINT64
    out = bytearray()
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _length_delimited(tag: bytes, payload: bytes) -> bytes:
    return tag + _varint(len(payload)) + payload


# Field tags, written once.
_REQUEST_RESOURCE_SPANS: Final = _tag(1, _LEN)
_RESOURCE_SPANS_RESOURCE: Final = _tag(1, _LEN)
_RESOURCE_SPANS_SCOPE_SPANS: Final = _tag(2, _LEN)
_RESOURCE_SPANS_SCHEMA_URL: Final = _tag(3, _LEN)
_RESOURCE_ATTRIBUTES: Final = _tag(1, _LEN)
_SCOPE_SPANS_SCOPE: Final = _tag(1, _LEN)
_SCOPE_SPANS_SPANS: Final = _tag(2, _LEN)
_SCOPE_SPANS_SCHEMA_URL: Final = _tag(3, _LEN)
_SCOPE_NAME: Final = _tag(1, _LEN)
_SCOPE_VERSION: Final = _tag(2, _LEN)
_SCOPE_ATTRIBUTES: Final = _tag(3, _LEN)
_SPAN_TRACE_ID: Final = _tag(1, _LEN) + _varint(16)
_SPAN_SPAN_ID: Final = _tag(2, _LEN) + _varint(8)
_SPAN_TRACE_STATE: Final = _tag(3, _LEN)
_SPAN_PARENT_SPAN_ID: Final = _tag(4, _LEN) + _varint(8)
_SPAN_NAME: Final = _tag(5, _LEN)
_SPAN_KIND: Final = _tag(6, _VARINT)
_SPAN_START: Final = _tag(7, _FIXED64)
_SPAN_END: Final = _tag(8, _FIXED64)
_SPAN_ATTRIBUTES: Final = _tag(9, _LEN)
_SPAN_DROPPED_ATTRIBUTES: Final = _tag(10, _VARINT)
_SPAN_EVENTS: Final = _tag(11, _LEN)
_SPAN_DROPPED_EVENTS: Final = _tag(12, _VARINT)
_SPAN_LINKS: Final = _tag(13, _LEN)
_SPAN_DROPPED_LINKS: Final = _tag(14, _VARINT)
_SPAN_STATUS: Final = _tag(15, _LEN)
_SPAN_FLAGS: Final = _tag(16, _FIXED32)
_EVENT_TIME: Final = _tag(1, _FIXED64)
_EVENT_NAME: Final = _tag(2, _LEN)
_EVENT_ATTRIBUTES: Final = _tag(3, _LEN)
_EVENT_DROPPED_ATTRIBUTES: Final = _tag(4, _VARINT)
_LINK_TRACE_ID: Final = _tag(1, _LEN) + _varint(16)
_LINK_SPAN_ID: Final = _tag(2, _LEN) + _varint(8)
_LINK_ATTRIBUTES: Final = _tag(4, _LEN)
_LINK_DROPPED_ATTRIBUTES: Final = _tag(5, _VARINT)
_LINK_FLAGS: Final = _tag(6, _FIXED32)
_STATUS_MESSAGE: Final = _tag(2, _LEN)
_STATUS_CODE: Final = _tag(3, _VARINT)
_KEY_VALUE_KEY: Final = _tag(1, _LEN)
_KEY_VALUE_VALUE: Final = _tag(2, _LEN)
_ANY_STRING: Final = _tag(1, _LEN)
_ANY_BOOL_TRUE: Final = _tag(2, _VARINT) + _varint(1)
_ANY_BOOL_FALSE: Final = _tag(2, _VARINT) + _varint(0)
_ANY_INT: Final = _tag(3, _VARINT)
_ANY_DOUBLE: Final = _tag(4, _FIXED64)
_ANY_ARRAY: Final = _tag(5, _LEN)
_ANY_KVLIST: Final = _tag(6, _LEN)
_ANY_BYTES: Final = _tag(7, _LEN)
_LIST_VALUES: Final = _tag(1, _LEN)  # ArrayValue.values and KeyValueList.values
_EMPTY: Final = b""
_EMPTY_MESSAGE: Final = _varint(0)


class UnencodableValue(ValueError):
    """An attribute value the OTLP AnyValue cannot hold (the attribute is dropped)."""


# Strings up to this many characters are kept encoded, per attribute key, up to this
# many values a key: stage names, phases, statuses and methods repeat in every batch.
CACHED_STRING_CHARS: Final = 64
CACHED_STRINGS_PER_KEY: Final = 32
_DOUBLE_VALUE: Final = _varint(9) + _tag(4, _FIXED64)  # AnyValue{double_value}, 9 bytes


class _KeyCodes:
    """The encoded forms of one attribute key: its ``KeyValue.key`` field, the start of
    its ``KeyValue`` for a double value (a fixed length), and its short string values'
    whole ``KeyValue`` messages (length-prefixed), and its int values' likewise."""

    __slots__ = ("double_start", "ints", "prefix", "strings")

    def __init__(self, key: str) -> None:
        raw = key.encode("utf-8")
        self.prefix: bytes = _length_delimited(_KEY_VALUE_KEY, raw) if raw else _EMPTY
        # varint(len(KeyValue)) + key field + value tag, then the 9 bytes of AnyValue
        start = self.prefix + _KEY_VALUE_VALUE + _DOUBLE_VALUE
        self.double_start: bytes = _varint(len(start) + 8) + start
        self.strings: dict[str, bytes] = {}
        self.ints: dict[int, bytes] = {}  # the same for int values (counts, codes repeat)


_key_codes: dict[str, _KeyCodes] = {}


def _codes(key: str) -> _KeyCodes:
    codes = _key_codes.get(key)
    if codes is None:
        if len(key) > CACHED_KEY_CHARS:
            return _KeyCodes(key)
        if len(_key_codes) >= KEY_CACHE_LIMIT:
            _key_codes.clear()
        codes = _key_codes[key] = _KeyCodes(key)
    return codes


def _string(tag: bytes, value: str) -> bytes:
    """A string field, omitted when empty (proto3)."""
    if not value:
        return _EMPTY
    return _length_delimited(tag, value.encode("utf-8"))


def _any_value(value: Any) -> bytes:
    """The ``AnyValue`` message of one attribute value (its payload, unprefixed)."""
    if value is None:
        return _EMPTY
    if isinstance(value, bool):
        return _ANY_BOOL_TRUE if value else _ANY_BOOL_FALSE
    if isinstance(value, str):
        return _length_delimited(_ANY_STRING, value.encode("utf-8"))
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise UnencodableValue(f"int {value} is outside int64")
        return _ANY_INT + _varint(value)
    if isinstance(value, float):
        return _ANY_DOUBLE + _pack_double(value)
    if isinstance(value, bytes):
        return _length_delimited(_ANY_BYTES, value)
    if isinstance(value, Sequence):
        values = [_length_delimited(_LIST_VALUES, _any_value(item)) for item in value]
        return _length_delimited(_ANY_ARRAY, _EMPTY.join(values))
    if isinstance(value, Mapping):
        pairs = [_length_delimited(_LIST_VALUES, _key_value(_codes(str(k)), v))
                 for k, v in value.items()]
        return _length_delimited(_ANY_KVLIST, _EMPTY.join(pairs))
    raise UnencodableValue(f"invalid type {type(value).__name__} of value {value!r}")


def _key_value(codes: _KeyCodes, value: Any) -> bytes:
    """One ``KeyValue`` message (unprefixed)."""
    return codes.prefix + _length_delimited(_KEY_VALUE_VALUE, _any_value(value))


def _append_attributes(out: list[bytes], tag: bytes,
                       attributes: Mapping[str, Any] | None) -> None:
    """Append the repeated ``KeyValue`` field ``tag`` of ``attributes`` to ``out``,
    dropping (and logging) each attribute whose value cannot be encoded."""
    if not attributes:
        return
    for key, value in attributes.items():
        try:
            codes = _codes(key)
            if type(value) is float:
                out.append(tag)
                out.append(codes.double_start)
                out.append(_pack_double(value))
                continue
            if type(value) is str and len(value) <= CACHED_STRING_CHARS:
                field = _kept_field(codes, codes.strings, value)
                out.append(tag)
                out.append(field)
                continue
            if type(value) is int:
                field = _kept_field(codes, codes.ints, value)  # raises before anything is appended
                out.append(tag)
                out.append(field)
                continue
            kv = _key_value(codes, value)
            out.append(tag)
            out.append(_varint(len(kv)))
            out.append(kv)
        except (UnencodableValue, UnicodeError, TypeError, ValueError, AttributeError) as exc:
            logger.error("tokenpath: OTLP encoding drops attribute %r: %s", key, exc)


def _kept_field(codes: _KeyCodes, cache: dict[Any, bytes], value: Any) -> bytes:
    """The length-prefixed ``KeyValue`` of ``value`` under ``codes``' key, kept in
    ``cache`` (its ``strings`` for short strings, ``ints`` for ints) for up to
    CACHED_STRINGS_PER_KEY values; raises as ``_any_value`` does (UnicodeError for a
    string that is not valid Unicode, UnencodableValue for an int outside int64)."""
    field = cache.get(value)
    if field is None:
        kv = _key_value(codes, value)
        field = _varint(len(kv)) + kv
        if len(cache) < CACHED_STRINGS_PER_KEY:
            cache[value] = field
    return field


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
    out: list[bytes] = []
    _append_attributes(out, tag, attributes)
    return _EMPTY.join(out)


def _uint(tag: bytes, value: int | None) -> bytes:
    """A uint32/uint64 varint field, omitted when zero (proto3)."""
    if not value:
        return _EMPTY
    return tag + _varint(value)


def _fixed64(tag: bytes, value: int | None) -> bytes:
    if not value:
        return _EMPTY
    return tag + value.to_bytes(8, "little")


def _flags(tag: bytes, context: Any) -> bytes:
    """A span's or link's flags: "has is_remote", and "is remote" for a remote context."""
    flags = _FLAG_HAS_IS_REMOTE
    if context and context.is_remote:
        flags |= _FLAG_IS_REMOTE
    return tag + flags.to_bytes(4, "little")


def _trace_state(trace_state: Any) -> bytes:
    if trace_state is None:
        return _EMPTY
    return _string(_SPAN_TRACE_STATE,
                   ",".join([f"{key}={value}" for key, value in trace_state.items()]))


_span_names: dict[str, bytes] = {}
_event_names: dict[str, bytes] = {}


def _name(cache: dict[str, bytes], tag: bytes, name: str) -> bytes:
    """A span's or an event's name field, kept encoded (names repeat; the cache is
    emptied past KEY_CACHE_LIMIT names)."""
    field = cache.get(name)
    if field is None:
        field = _string(tag, name)
        if len(cache) >= KEY_CACHE_LIMIT:
            cache.clear()
        cache[name] = field
    return field


def _append_event(out: list[bytes], event: Any) -> None:
    """Append one span's ``events`` entry (tag, length, message) to ``out``."""
    _append_event_fields(out, event.name, event.timestamp, event.attributes,
                         event.dropped_attributes)


def _append_event_fields(out: list[bytes], name: str, timestamp: int | None,
                         attributes: Mapping[str, Any] | None, dropped: int) -> None:
    parts: list[bytes] = []
    if timestamp:
        parts.append(_EVENT_TIME)
        parts.append(timestamp.to_bytes(8, "little"))
    parts.append(_name(_event_names, _EVENT_NAME, name))
    _append_attributes(parts, _EVENT_ATTRIBUTES, attributes)
    if dropped:
        parts.append(_EVENT_DROPPED_ATTRIBUTES)
        parts.append(_varint(dropped))
    payload = _EMPTY.join(parts)
    out.append(_SPAN_EVENTS)
    out.append(_varint(len(payload)))
    out.append(payload)


def _link(link: Any) -> bytes:
    context = link.context
    return _EMPTY.join((
        _LINK_TRACE_ID, context.trace_id.to_bytes(16, "big"),
        _LINK_SPAN_ID, context.span_id.to_bytes(8, "big"),
        _attributes(_LINK_ATTRIBUTES, link.attributes),
        _uint(_LINK_DROPPED_ATTRIBUTES, link.dropped_attributes),
        _flags(_LINK_FLAGS, context),
    ))


def _status(status: Any) -> bytes:
    if status is None:
        return _EMPTY
    payload = _string(_STATUS_MESSAGE, status.description or "") + _uint(
        _STATUS_CODE, status.status_code._value_)  # an Enum's value without its descriptor
    return _length_delimited(_SPAN_STATUS, payload)


def _span_head(context: Any, parent: Any, name: str, kind: Any, start_time: int | None,
               end_time: int | None, attributes: Mapping[str, Any] | None) -> list[bytes]:
    """A ``Span`` message's fields up to and including its attributes."""
    parts = [
        _SPAN_TRACE_ID, context.trace_id.to_bytes(16, "big"),
        _SPAN_SPAN_ID, context.span_id.to_bytes(8, "big"),
        _trace_state(context.trace_state),
    ]
    if parent:
        parts.append(_SPAN_PARENT_SPAN_ID)
        parts.append(parent.span_id.to_bytes(8, "big"))
    parts.append(_name(_span_names, _SPAN_NAME, name))
    parts.append(_SPAN_KIND)
    parts.append(_varint(kind._value_ + 1))  # the SDK's SpanKind is OTLP's minus one
    parts.append(_fixed64(_SPAN_START, start_time))
    parts.append(_fixed64(_SPAN_END, end_time))
    _append_attributes(parts, _SPAN_ATTRIBUTES, attributes)
    return parts


def _span(span: Any) -> bytes:
    """One ``Span`` message (unprefixed) of an SDK ``ReadableSpan``."""
    parent = span.parent
    parts = _span_head(span.get_span_context(), parent, span.name, span.kind,
                       span.start_time, span.end_time, span.attributes)
    parts.append(_uint(_SPAN_DROPPED_ATTRIBUTES, span.dropped_attributes))
    events = span.events
    if events:
        for event in events:
            _append_event(parts, event)
    parts.append(_uint(_SPAN_DROPPED_EVENTS, span.dropped_events))
    links = span.links
    if links:
        for link in links:
            parts.append(_length_delimited(_SPAN_LINKS, _link(link)))
    parts.append(_uint(_SPAN_DROPPED_LINKS, span.dropped_links))
    parts.append(_status(span.status))
    parts.append(_flags(_SPAN_FLAGS, parent))
    return _EMPTY.join(parts)


def _resource(resource: Any) -> bytes:
    """``ResourceSpans.resource``, always present (empty for no attributes)."""
    return _length_delimited(_RESOURCE_SPANS_RESOURCE,
                             _attributes(_RESOURCE_ATTRIBUTES, resource.attributes))


def _scope(scope: Any) -> bytes:
    """``ScopeSpans.scope``, always present (empty for no scope)."""
    if scope is None:
        return _SCOPE_SPANS_SCOPE + _EMPTY_MESSAGE
    payload = _EMPTY.join((
        _string(_SCOPE_NAME, scope.name or ""),
        _string(_SCOPE_VERSION, scope.version or ""),
        _attributes(_SCOPE_ATTRIBUTES, scope.attributes),
    ))
    return _length_delimited(_SCOPE_SPANS_SCOPE, payload)


class EncodedSpan:
    """One span already written as its ``Span`` message, with the resource and scope it
    is grouped under: what :class:`TokenpathBatchSpanProcessor` queues in the span's
    place, so that the span's own objects (attributes, events, their dictionaries) are
    freed when it ends instead of surviving in the export queue into the garbage
    collector's older generations."""

    __slots__ = ("payload", "resource", "scope")

    def __init__(self, resource: Any, scope: Any, payload: bytes) -> None:
        self.resource = resource
        self.scope = scope
        self.payload = payload


def encode_span(span: Any) -> EncodedSpan:
    """``span`` (an SDK ``ReadableSpan``) as an :class:`EncodedSpan`."""
    return EncodedSpan(span.resource, span.instrumentation_scope or None, _span(span))


_NO_GROUP: Final = object()  # no span grouped yet


def encode_export_request(spans: Sequence[Any]) -> bytes:
    """The serialized ``ExportTraceServiceRequest`` of ``spans`` (SDK ``ReadableSpan``
    or :class:`EncodedSpan`, mixed as they come), byte-identical to the OpenTelemetry
    exporters' own encoding of the same spans."""
    groups: dict[Any, dict[Any, list[bytes]]] = {}
    last_resource: Any = _NO_GROUP
    last_scope: Any = _NO_GROUP
    scopes: dict[Any, list[bytes]] = {}
    encoded: list[bytes] = []
    for span in spans:
        if isinstance(span, EncodedSpan):
            resource, scope, payload = span.resource, span.scope, span.payload
        else:
            resource, scope = span.resource, span.instrumentation_scope or None
            payload = _span(span)
        # A batch's spans mostly share one resource and scope object: the dictionaries
        # (which hash a resource's attributes as JSON) are asked only when they change.
        if resource is not last_resource or scope is not last_scope:
            found = groups.get(resource)
            if found is None:
                found = groups[resource] = {}
            scopes = found
            listed = scopes.get(scope)
            if listed is None:
                listed = scopes[scope] = []
            encoded = listed
            last_resource, last_scope = resource, scope
        encoded.append(_SCOPE_SPANS_SPANS)
        encoded.append(_varint(len(payload)))
        encoded.append(payload)
    out: list[bytes] = []
    for resource, scopes in groups.items():
        parts = [_resource(resource)]
        for scope, encoded in scopes.items():
            scope_spans = _scope(scope) + _EMPTY.join(encoded)
            if scope is not None:
                scope_spans += _string(_SCOPE_SPANS_SCHEMA_URL, scope.schema_url or "")
            parts.append(_length_delimited(_RESOURCE_SPANS_SCOPE_SPANS, scope_spans))
        parts.append(_string(_RESOURCE_SPANS_SCHEMA_URL, resource.schema_url or ""))
        out.append(_length_delimited(_REQUEST_RESOURCE_SPANS, _EMPTY.join(parts)))
    return _EMPTY.join(out)
