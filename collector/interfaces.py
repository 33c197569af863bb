"""The collector's seams: what each component hands its downstream, and on which thread.

::

    receivers ──SpanConsumer──> assembler ──TraceConsumer──> pipeline worker
        │                                                       │ (one thread)
        ├──PointsConsumer──> node metrics ──> GPU energy         ├──> mapper ──RecordConsumer──>
        └──RecordBatchConsumer (forwarded records, progress) ────┘      call joiner / attributor
                                                                          ──RecordSink──> sinks

Each component is given its downstream at construction and knows nothing else of the
pipeline. The thread contract of each seam is in its docstring: a component called from
"any receiver thread" guards its own state; one called "on the pipeline thread" is
never called concurrently and needs no lock for what only that thread touches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from tokenpath.collector.assembler import AssembledTrace
    from tokenpath.collector.cost.sources import SourceProgress
    from tokenpath.collector.receivers.otlp_decode import MetricPoint
    from tokenpath.collector.spans import SpanData
    from tokenpath.records import IdleCost, RequestRecord


class SpanConsumer(Protocol):
    """Receivers -> assembler. Called from any receiver thread (HTTP and gRPC at once)."""

    def consume_spans(self, spans: list[SpanData]) -> Mapping[str, int]:
        """Take spans; returns the spans refused (late, over a limit) by reason."""
        ...


class PointsConsumer(Protocol):
    """Receivers -> node metrics -> GPU energy readings. Called from any receiver
    thread; returns the points taken."""

    def consume_points(self, points: Iterable[MetricPoint]) -> int: ...


class RecordBatchConsumer(Protocol):
    """Receivers -> pipeline worker: forwarded records to price, each with the replica
    that sent it (``sources``, parallel to ``records``), and the replicas' progress
    messages. Called from any receiver thread; never waits (admission has checked the
    backlogs before); False: nothing taken (overloaded)."""

    def offer_records(self, records: list[RequestRecord],
                      sources: Sequence[str | None] = (),
                      progress: Sequence[SourceProgress] = (),
                      priced_parts: Sequence[RequestRecord] = ()) -> bool: ...


class ForwardedConsumer(Protocol):
    """Pipeline worker -> attributor: forwarded records and progress, on the pipeline
    thread only, in the order they arrived (a batch's records before its progress)."""

    def consume_forwarded(self, record: RequestRecord, source: str | None) -> None: ...

    def consume_progress(self, progress: SourceProgress) -> None: ...


class ForwardedPartsConsumer(ForwardedConsumer, Protocol):
    """... and the parts of disaggregated records other collectors priced
    (collector/cost/disaggregated_parts.py)."""

    def consume_priced_part(self, part: RequestRecord) -> None: ...


class TraceConsumer(Protocol):
    """Assembler -> pipeline worker -> mapper. The worker's ``consume_trace`` is called
    from any receiver thread and the assembler's sweeper, and queues the trace; the
    mapper's runs on the pipeline thread. ``shutdown`` flushes what is held."""

    def consume_trace(self, trace: AssembledTrace) -> None: ...

    def shutdown(self) -> None: ...


class RecordConsumer(Protocol):
    """Mapper -> call joiner -> attributor (or the forwarder). Called on the pipeline
    thread only; ``shutdown`` once, after the last record."""

    def consume_record(self, record: RequestRecord) -> None: ...

    def shutdown(self) -> None: ...


class RecordSink(Protocol):
    """Attributor -> sinks (Prometheus exposition, the store, the UI feed), through the
    fan-out. ``consume_*`` are called on the pipeline thread only, and may wait there (the
    store's back-pressure); ``shutdown`` after the pipeline stopped, and flushes."""

    def consume_record(self, record: RequestRecord) -> None: ...

    def consume_idle_cost(self, idle: IdleCost) -> None: ...

    def shutdown(self) -> None: ...


class Ticking(Protocol):
    """A component with time-driven work (the call joiner's grace, the attributor's
    quiet units): ``tick`` runs on the pipeline thread every ``tick_seconds``."""

    @property
    def tick_seconds(self) -> float: ...

    def tick(self) -> None: ...


class Stepped(Protocol):
    """A component whose queued work (the attributor's closes and the pricing of what
    they finish) runs in bounded steps on the pipeline thread. Once given a hook, its
    ``consume_record`` and ``tick`` only queue; the pipeline worker then calls ``step``
    (True while work remains) after each item, giving up the GIL between two steps, and
    the component calls ``hook`` between the steps it runs itself (at shutdown)."""

    def yield_between_steps(self, hook: Callable[[], None] | None) -> None: ...

    def step(self) -> bool: ...
