"""One poll's worth of agent metrics, shared by the Prometheus collector and the OTLP push.

A :class:`Snapshot` maps each :class:`~tokenpath.metric_names.MetricSpec` to its series
(label values in the spec's label order -> value). Counters in a snapshot are already
cumulative and monotonic; gauges are the latest reading.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tokenpath.labels import BoundedLabel
from tokenpath.metric_names import MetricSpec

LabelValues = tuple[str, ...]


@dataclass(slots=True)
class Snapshot:
    """Series per metric from one poll; ``taken_unix_nano`` is the wall-clock poll time."""

    taken_unix_nano: int
    points: dict[MetricSpec, dict[LabelValues, float]] = field(default_factory=dict)

    def add(self, spec: MetricSpec, labels: LabelValues, value: float) -> None:
        """Set one series; a second value for the same series is added (bounded labels
        may fold several sources into ``other``)."""
        series = self.points.get(spec)
        if series is None:
            self.points[spec] = {labels: value}
        elif labels in series:
            series[labels] += value
        else:
            series[labels] = value

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
