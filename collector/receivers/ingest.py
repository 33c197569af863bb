"""What both transports do with a decoded export request: limits, counting, hand-off.

The HTTP and gRPC receivers call :class:`OtlpIngest`; it decodes, counts accepted and
rejected spans by receiver, sheds load while a stage behind it is backed up (admission,
collector/backpressure.py), and passes spans on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tokenpath.collector.backpressure import Backlog, first_over
from tokenpath.collector.interfaces import PointsConsumer, RecordBatchConsumer, SpanConsumer
from tokenpath.collector.limits import IngestLimits
from tokenpath.collector.receivers.otlp_decode import (
    DECODER_REFERENCE,
    DecodedSpans,
    decode_metrics,
    decode_trace_payload,
    decode_traces,
)
from tokenpath.collector.record_logs import decode_records
from tokenpath.collector.stats import CollectorStats

DEFAULT_MAX_BUFFERED_SPANS = 2_000_000
RETRY_AFTER_SECONDS = 2


class Overloaded(Exception):
    """A stage is backed up: the client should retry after ``retry_after`` seconds."""

    def __init__(self, retry_after: int = RETRY_AFTER_SECONDS, why: str | None = None
                 ) -> None:
        super().__init__("collector is shedding load" + (f": {why}" if why else ""))
        self.retry_after = retry_after


def admit(backlogs: Sequence[Backlog]) -> None:
    """The admission decision: raise :class:`Overloaded` (naming the backlog) when any of
    ``backlogs`` is at or past its high-water mark."""
    over = first_over(backlogs)
    if over is not None:
        raise Overloaded(why=over.describe())


class OtlpIngest:
    """``span_backlogs``: what spans fill before they are records (the assembler's
    buffered spans); ``record_backlogs``: the stages every record passes (the pipeline
    queue, the store's write queue). Traces are refused while any of both is at its
    high-water mark, forwarded records while a record backlog is."""

    def __init__(
        self,
        spans: SpanConsumer,
        metrics: PointsConsumer,
        limits: IngestLimits,
        stats: CollectorStats,
        span_backlogs: Sequence[Backlog] = (),
        records: RecordBatchConsumer | None = None,
        record_backlogs: Sequence[Backlog] = (),
    ) -> None:
        self._spans = spans
        self._metrics = metrics
        self._records = records
        self.limits = limits
        self._stats = stats
        self._trace_backlogs = (*span_backlogs, *record_backlogs)
        self._record_backlogs = tuple(record_backlogs)

    @property
    def trace_backlogs(self) -> tuple[Backlog, ...]:
        """What an export of traces is admitted against."""
        return self._trace_backlogs

    @property
    def record_backlogs(self) -> tuple[Backlog, ...]:
        """What an export of forwarded records is admitted against."""
        return self._record_backlogs

    def admit_traces(self) -> None:
        """Raise :class:`Overloaded` while a stage behind the receivers is backed up:
        receivers call this before reading a body, so shedding costs no parsing."""
        admit(self._trace_backlogs)

    def admit_logs(self) -> None:
        admit(self._record_backlogs)

    def export_logs(self, message: ExportLogsServiceRequest, receiver: str
                    ) -> ExportLogsServiceResponse:
        """Forwarded request records (collector/record_logs.py) to price here; other log
        records are refused as partial success."""
        decoded = decode_records(message)
        response = ExportLogsServiceResponse()
        if self._records is None:
            decoded.rejected += len(decoded.records)
            decoded.reasons.append("this collector prices no forwarded records")
        elif decoded.records or decoded.progress or decoded.priced_parts:
            if not self._records.offer_records(decoded.records, decoded.sources,
                                               decoded.progress, decoded.priced_parts):
                raise Overloaded()
            self._stats.records_received.inc(receiver, len(decoded.records))
        if decoded.rejected:
            response.partial_success.rejected_log_records = decoded.rejected
            response.partial_success.error_message = decoded.error_message
        return response

    def export_trace_payload(self, body: bytes, content_type: str, receiver: str
                             ) -> DecodedSpans:
        """An export request's body (protobuf or OTLP/JSON): decoded, counted, handed on.
        Raises :class:`MalformedPayload` or :class:`Overloaded`."""
        self.admit_traces()
        decoded, decoder = decode_trace_payload(body, content_type, self.limits)
        self._stats.trace_exports_decoded.inc(decoder)
        return self._take(decoded, receiver)

    def export_traces(self, message: ExportTraceServiceRequest, receiver: str) -> DecodedSpans:
        """The same for a request already parsed by protobuf."""
        self.admit_traces()
        self._stats.trace_exports_decoded.inc(DECODER_REFERENCE)
        return self._take(decode_traces(message, self.limits), receiver)

    def _take(self, decoded: DecodedSpans, receiver: str) -> DecodedSpans:
        stats = self._stats
        for reason, n in decoded.rejection_reasons.items():
            stats.spans_rejected.inc((receiver, reason), n)
        stats.attributes_dropped.inc("attributes_per_span", decoded.attributes_dropped)
        stats.attributes_dropped.inc("genai_content", decoded.content_attributes_dropped)
        stats.attributes_dropped.inc("value_truncated", decoded.values_truncated)
        stats.events_dropped.inc("events_per_span", decoded.events_dropped)
        stats.events_dropped.inc("genai_content", decoded.content_events_dropped)
        if decoded.spans:
            stats.spans_received.inc(receiver, len(decoded.spans))
            refused = self._spans.consume_spans(decoded.spans)
            # Reported to the client as rejected; the assembler counted them (spans_dropped).
            for reason, n in refused.items():
                decoded.reject(reason, n)
        return decoded

    def export_metrics(self, message: ExportMetricsServiceRequest, receiver: str
                       ) -> ExportMetricsServiceResponse:
        """Takes the points; the response says how many were refused (partial success)."""
        points = decode_metrics(message, self.limits)
        accepted = self._metrics.consume_points(points)
        refused = len(points) - accepted
        self._stats.metric_points_received.inc(receiver, accepted)
        self._stats.metric_points_dropped.inc("max_series", refused)
        response = ExportMetricsServiceResponse()
        if refused:
            response.partial_success.rejected_data_points = refused
            response.partial_success.error_message = (
                f"rejected {refused} data points: over the collector's series limit")
        return response


def partial_success(response: Any, decoded: DecodedSpans) -> None:
    """Fill an ExportTraceServiceResponse's partial_success (OTLP section "Partial Success").

    Refused spans set ``rejected_spans`` and ``error_message``; when every span was accepted
    but attributes were cut to the limits, ``error_message`` alone carries that warning.
    """
    if decoded.rejected:
        response.partial_success.rejected_spans = decoded.rejected
        response.partial_success.error_message = decoded.error_message
    elif decoded.warning_message:
        response.partial_success.error_message = decoded.warning_message
