"""Build collector SpanData directly, and an in-memory trace consumer, for unit tests."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from tokenpath.collector.assembler import AssembledTrace
from tokenpath.collector.spans import Attributes, SpanData, SpanEvent

_ids = itertools.count(1)


def new_trace_id() -> str:
    return format(next(_ids), "032x")


def span(
    trace_id: str,
    name: str = "span",
    *,
    span_id: str | None = None,
    parent: str = "",
    start: float = 1000.0,
    end: float = 1001.0,
    kind: int = 1,
    attributes: Attributes | None = None,
    events: list[SpanEvent] | None = None,
    resource: Attributes | None = None,
) -> SpanData:
    return SpanData(
        trace_id=trace_id,
        span_id=span_id or format(next(_ids), "016x"),
        parent_span_id=parent,
        name=name,
        kind=kind,
        start_unix_nano=int(start * 1e9),
        end_unix_nano=int(end * 1e9),
        attributes=dict(attributes or {}),
        events=list(events or []),
        resource=dict(resource or {}),
    )


@dataclass
class TraceSink:
    """Collects what an Assembler emits."""

    traces: list[AssembledTrace] = field(default_factory=list)
    shut: int = 0

    def consume_trace(self, trace: AssembledTrace) -> None:
        self.traces.append(trace)

    def shutdown(self) -> None:
        self.shut += 1


