"""OTLP ``AnyValue`` and ``KeyValue`` from Python values: the one builder every OTLP writer
shares (the agent's metric push, the record forwarder's logs, the sample trace, and the
tests' and benchmarks' payloads)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


def any_value(value: Any) -> AnyValue:
    """A bool (not an int here), int, float, bytes, a list or tuple (an array, each item
    converted), a mapping (a key-value list); anything else as its string."""
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, bytes):
        return AnyValue(bytes_value=value)
    if isinstance(value, str):
        return AnyValue(string_value=value)
    out = AnyValue()
    if isinstance(value, Mapping):
        out.kvlist_value.values.extend(key_value(str(k), v) for k, v in value.items())
        return out
    if isinstance(value, Sequence):
        out.array_value.values.extend(any_value(v) for v in value)
        return out
    return AnyValue(string_value=str(value))


def key_value(key: str, value: Any) -> KeyValue:
    return KeyValue(key=key, value=any_value(value))


def key_values(attributes: Mapping[str, Any]) -> list[KeyValue]:
    return [key_value(k, v) for k, v in attributes.items()]
