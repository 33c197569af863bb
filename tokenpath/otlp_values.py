"""OTLP ``KeyValue`` attributes from Python values: the one builder the package's OTLP
writers share (the agent's metric push, the record forwarder's logs, the sample trace)."""

from __future__ import annotations

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


def key_value(key: str, value: str | bool | int | float) -> KeyValue:
    """A string, bool, int or float attribute (a bool is not an int here)."""
    if isinstance(value, str):
        return KeyValue(key=key, value=AnyValue(string_value=value))
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(double_value=value))
