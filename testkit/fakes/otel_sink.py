"""An in-memory span sink on the real OpenTelemetry SDK (shared by the instrumentation tests)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tokenpath import attributes as attr
from tokenpath.stages import StageId


class SpanSink:
    """A real SDK tracer provider exporting synchronously into memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider(shutdown_on_exit=False)
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def spans(self) -> tuple[ReadableSpan, ...]:
        return tuple(self.exporter.get_finished_spans())

    def by_trace(self) -> dict[str, list[ReadableSpan]]:
        out: dict[str, list[ReadableSpan]] = defaultdict(list)
        for span in self.spans():
            assert span.context is not None
            out[format(span.context.trace_id, "032x")].append(span)
        return dict(out)

    def clear(self) -> None:
        self.exporter.clear()

    def shutdown(self) -> None:
        self.provider.shutdown()


class RaisingExporter(SpanExporter):
    """An exporter that raises on every call (a broken backend)."""

    def __init__(self) -> None:
        self.calls = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        raise RuntimeError("exporter is broken")

    def shutdown(self) -> None:
        pass


def stage_entries(spans: Sequence[ReadableSpan]) -> Iterator[tuple[StageId, float, dict[str, Any]]]:
    """Every stage recorded on ``spans``: (stage, seconds, attributes), both contract forms."""
    for span in spans:
        attributes = dict(span.attributes or {})
        stage = attributes.get(attr.STAGE)
        if stage is not None and span.start_time is not None and span.end_time is not None:
            yield StageId(str(stage)), (span.end_time - span.start_time) / 1e9, attributes
        for event in span.events:
            if event.name == attr.STAGE_EVENT:
                event_attributes = dict(event.attributes or {})
                yield (StageId(str(event_attributes[attr.STAGE])),
                       float(event_attributes[attr.STAGE_SECONDS]), event_attributes)


def all_attribute_values(spans: Sequence[ReadableSpan]) -> Iterator[str]:
    """Every attribute value (span, event, resource) as text, for content checks."""
    for span in spans:
        sources = [span.attributes or {}, span.resource.attributes]
        sources.extend(event.attributes or {} for event in span.events)
        for mapping in sources:
            for value in mapping.values():
                yield str(value)
        yield span.name
