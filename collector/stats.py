"""Collector self-telemetry as plain counters; the Prometheus sink exposes them.

Every drop anywhere in the pipeline is counted here under a reason (SPEC section 8).
"""

from __future__ import annotations

import threading
from collections import Counter


class CollectorStats:
    """Thread-safe counters keyed by (name, label value). No Prometheus in here."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.spans_received: Counter[str] = Counter()  # by receiver
        self.spans_rejected: Counter[tuple[str, str]] = Counter()  # (receiver, reason)
        self.spans_dropped: Counter[str] = Counter()  # by reason
        self.spans_summarised: Counter[str] = Counter()  # folded on ingest, by kind
        self.traces_evicted: Counter[str] = Counter()  # by reason
        self.attributes_dropped: Counter[str] = Counter()  # by reason
        self.requests_rejected: Counter[tuple[str, str]] = Counter()  # (receiver, status)
        self.metric_points_received: Counter[str] = Counter()
        self.metric_points_dropped: Counter[str] = Counter()  # by reason
        self.events_dropped: Counter[str] = Counter()  # span events, by reason
        self.spans_unmapped = 0
        self.records_stored = 0
        self.store_errors = 0
        self.traces_in_flight = 0
        self.spans_buffered = 0
        self.pipeline_queue_depth = 0
        self.records_forwarded = 0
        self.records_forward_dropped: Counter[str] = Counter()  # by reason
        self.records_received: Counter[str] = Counter()  # by receiver
        # HTTP server traces that were not LLM calls (health checks, docs, 404s), by class
        self.http_calls_not_llm: Counter[str] = Counter()
        # a call's client or proxy record joined to its serving side (collector/call_join)
        self.calls_joined: Counter[str] = Counter()  # by outcome

    def add(
        self, counter: Counter[str] | Counter[tuple[str, str]], key: object, n: int = 1
    ) -> None:
        if n:
            with self._lock:
                counter[key] += n  # type: ignore[index]

    def incr(self, field: str, n: int = 1) -> None:
        if n:
            with self._lock:
                setattr(self, field, getattr(self, field) + n)

    def set_gauges(self, traces_in_flight: int, spans_buffered: int) -> None:
        self.traces_in_flight = traces_in_flight
        self.spans_buffered = spans_buffered
