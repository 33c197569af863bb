"""One poll's worth of agent metrics, shared by the Prometheus collector and the OTLP push.

A :class:`Snapshot` maps each :class:`~tokenpath.metric_names.MetricSpec` to its series
(label values in the spec's label order -> value). Counters in a snapshot are already
cumulative and monotonic; gauges are the latest reading.

A poll hands the snapshot its per-device readings as rows (one per GPU or NIC) with a
function that turns them into series; that runs once, when the snapshot is first read.
At 1 Hz polling, a 15 s scrape and a 5 s push, most polls are never read.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from tokenpath.labels import BoundedLabel
from tokenpath.metric_names import MetricSpec

logger = logging.getLogger(__name__)

LabelValues = tuple[str, ...]
Points = dict[MetricSpec, dict[LabelValues, float]]
Deferred = Callable[[Points], None]


class Snapshot:
    """Series per metric from one poll; ``taken_unix_nano`` is the wall-clock poll time.

    ``deferred`` functions add their series to :attr:`points` on its first read (under a
    lock, so concurrent readers see them exactly once)."""

    __slots__ = ("_deferred", "_lock", "_points", "taken_unix_nano")

    def __init__(self, taken_unix_nano: int, points: Points | None = None,
                 deferred: Iterable[Deferred] = ()) -> None:
        self.taken_unix_nano = taken_unix_nano
        self._points: Points = {} if points is None else points
        self._deferred = list(deferred)
        self._lock = threading.Lock() if self._deferred else None

    @property
    def points(self) -> Points:
        lock = self._lock
        if lock is not None:
            with lock:
                deferred, self._deferred = self._deferred, []
                for fill in deferred:
                    try:
                        fill(self._points)
                    except Exception:  # a bad row loses its series, not the snapshot
                        logger.exception("agent snapshot: building series failed")
            self._lock = None
        return self._points

    def get(self, spec: MetricSpec, labels: LabelValues = ()) -> float | None:
        series = self.points.get(spec)
        return None if series is None else series.get(labels)

    def series_count(self) -> int:
        return sum(len(series) for series in self.points.values())

    def to_json(self) -> dict[str, Any]:
        """``{taken_unix_nano, metrics: {series name: [{labels, value}]}}`` for ``--once``."""
        metrics: dict[str, list[dict[str, Any]]] = {}
        for spec, series in self.points.items():
            metrics[spec.series] = [
                {"labels": dict(zip(spec.labels, labels, strict=True)), "value": value}
                for labels, value in series.items()
            ]
        return {"taken_unix_nano": self.taken_unix_nano, "metrics": metrics}


def add_point(points: Points, spec: MetricSpec, labels: LabelValues, value: float) -> None:
    """Sets one series in ``points``; a second value for it is added to the first."""
    series = points.get(spec)
    if series is None:
        points[spec] = {labels: value}
    elif labels in series:
        series[labels] += value
    else:
        series[labels] = value


class ErrorCounts:
    """``tokenpath_agent_scrape_errors_total{source}``: failures per device, file or
    endpoint, with the ``source`` label bounded."""

    def __init__(self, source_cap: int) -> None:
        self._bound = BoundedLabel(source_cap)
        self._counts: dict[str, float] = {}

    def count(self, source: str) -> None:
        key = self._bound(source)
        self._counts[key] = self._counts.get(key, 0.0) + 1.0

    def get(self, source: str) -> float:
        return self._counts.get(source, 0.0)

    def items(self) -> list[tuple[str, float]]:
        return list(self._counts.items())
