"""The collector's shared self-telemetry: the receivers', assembler's, mapper's, joiner's,
forwarder's and store's counters, each an instrument built from its spec
(:mod:`tokenpath.telemetry`); the Prometheus exporter writes every one of them.

Every drop anywhere in the pipeline is counted here under a reason (docs/reliability.md).
"""

from __future__ import annotations

from tokenpath import metric_names as M
from tokenpath.telemetry import Count, LabelledCount, Level, Telemetry

# the pipeline steps that count their errors (tokenpath_collector_pipeline_errors_total)
PIPELINE_STEP_HAND_OFF = "hand_off"  # the assembler handing a trace to the worker
PIPELINE_STEP_TRACE = "trace"  # mapping and pricing one trace
PIPELINE_STEP_RECORDS = "records"  # pricing forwarded records
PIPELINE_STEP_PRICING = "pricing"  # a bounded step of the attributor's queued closes


class CollectorStats(Telemetry):
    """Thread-safe counters shared by the collector's components. No Prometheus in here."""

    def __init__(self) -> None:
        self.spans_received = LabelledCount(M.SPANS_RECEIVED)  # by receiver
        self.spans_rejected = LabelledCount(M.SPANS_REJECTED)  # (receiver, reason)
        self.spans_dropped = LabelledCount(M.SPANS_DROPPED)  # by reason
        self.spans_summarised = LabelledCount(M.SPANS_SUMMARISED)  # folded on ingest
        self.trace_exports_decoded = LabelledCount(M.TRACE_EXPORTS_DECODED)  # by decoder
        self.traces_evicted = LabelledCount(M.TRACES_EVICTED)  # by reason
        self.pipeline_errors = LabelledCount(M.PIPELINE_ERRORS)  # by step
        self.attributes_dropped = LabelledCount(M.ATTRIBUTES_DROPPED)  # by reason
        self.requests_rejected = LabelledCount(M.REQUESTS_REJECTED)  # (receiver, status)
        self.metric_points_received = LabelledCount(M.METRIC_POINTS_RECEIVED)
        self.metric_points_dropped = LabelledCount(M.METRIC_POINTS_DROPPED)  # by reason
        self.events_dropped = LabelledCount(M.SPAN_EVENTS_DROPPED)  # span events
        self.spans_unmapped = Count(M.SPANS_UNMAPPED)
        self.records_stored = Count(M.RECORDS_STORED)
        self.store_errors = Count(M.STORE_ERRORS)
        # records lost after admission (collector/backpressure.py), by reason
        self.records_dropped = LabelledCount(M.RECORDS_DROPPED)
        self.traces_in_flight = Level(M.TRACES_IN_FLIGHT)
        self.spans_buffered = Level(M.SPANS_BUFFERED)
        self.pipeline_queue_depth = Level(M.PIPELINE_QUEUE_DEPTH)
        self.records_forwarded = Count(M.RECORDS_FORWARDED)
        self.progress_forwarded = Count(M.PROGRESS_FORWARDED)
        self.records_forward_dropped = LabelledCount(M.RECORDS_FORWARD_DROPPED)  # by reason
        self.records_received = LabelledCount(M.RECORDS_RECEIVED)  # by receiver
        # HTTP server traces that were not LLM calls (health checks, docs, 404s), by class
        self.http_calls_not_llm = LabelledCount(M.HTTP_CALLS_NOT_LLM)
        # a call's client or proxy record joined to its serving side (collector/call_join)
        self.calls_joined = LabelledCount(M.CALLS_JOINED)  # by outcome

    def set_gauges(self, traces_in_flight: int, spans_buffered: int) -> None:
        self.traces_in_flight.set(traces_in_flight)
        self.spans_buffered.set(spans_buffered)
