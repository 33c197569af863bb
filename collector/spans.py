"""The collector's own span representation: what the receivers decode OTLP into.

Small slotted objects holding only what the pipeline reads; attribute values are plain
Python values (str, bool, int, float, or a tuple of those).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

AttrValue = str | bool | int | float | tuple[object, ...]
Attributes = dict[str, AttrValue]


def attribute_number(value: AttrValue | None) -> float | None:
    """A finite number from an attribute (a number, or a string of one); None for
    anything else (booleans, non-finite values, text)."""
    if isinstance(value, bool) or value is None:
        return None
    # one type a test: compiled, ``isinstance(value, int | float)`` builds the union
    # object on every call (this runs for each count a trace carries)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, int):
        f = float(value)
        return f if math.isfinite(f) else None
    if isinstance(value, str):
        try:
            f = float(value)
        except ValueError:
            return None
        return f if math.isfinite(f) else None
    return None

SPAN_KIND_SERVER = 2
SPAN_KIND_CLIENT = 3
STATUS_CODE_ERROR = 2


@dataclass(slots=True)
class SpanEvent:
    name: str
    time_unix_nano: int
    attributes: Attributes


@dataclass(slots=True)
class SpanData:
    trace_id: str  # 32 lowercase hex
    span_id: str  # 16 lowercase hex
    parent_span_id: str  # "" for a root span
    name: str
    kind: int
    start_unix_nano: int
    end_unix_nano: int
    attributes: Attributes
    events: Sequence[SpanEvent] = ()  # a shared empty tuple for the many spans without
    resource: Attributes = field(default_factory=dict)
    status_code: int = 0  # OTLP: 0 unset, 1 ok, 2 error
    # Its parent is in another process (OTLP span flags): the span is a local root.
    remote_parent: bool = False

    @property
    def is_root(self) -> bool:
        return not self.parent_span_id

    @property
    def is_local_root(self) -> bool:
        """The first span of this process in the trace: a server span whose caller (a
        client that may export elsewhere) is another process."""
        return self.remote_parent and self.kind == SPAN_KIND_SERVER

    @property
    def duration_seconds(self) -> float:
        return max(0, self.end_unix_nano - self.start_unix_nano) / 1e9

    def attr(self, key: str) -> AttrValue | None:
        """A span attribute, falling back to the resource's."""
        value = self.attributes.get(key)
        if value is None:
            value = self.resource.get(key)
        return value
