"""Latest OTLP metric points per node (from the agent): used by cost attribution."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from tokenpath.attributes import HOST_NAME, NODE
from tokenpath.collector.receivers.otlp_decode import MetricPoint

DEFAULT_MAX_SERIES = 50_000


@dataclass(frozen=True, slots=True)
class SeriesKey:
    node: str
    name: str
    labels: tuple[tuple[str, str], ...]


class NodeMetricsState:
    """Bounded map of the newest value of each (node, metric, labels) series."""

    def __init__(self, max_series: int = DEFAULT_MAX_SERIES) -> None:
        self._max_series = max_series
        self._lock = threading.Lock()
        self._latest: dict[SeriesKey, tuple[int, float]] = {}
        self.dropped = 0

    def consume_points(self, points: Iterable[MetricPoint]) -> int:
        accepted = 0
        with self._lock:
            for p in points:
                node = p.resource.get(NODE) or p.resource.get(HOST_NAME) or "unknown"
                key = SeriesKey(str(node), p.name,
                                tuple(sorted((k, str(v)) for k, v in p.attributes.items())))
                if key not in self._latest and len(self._latest) >= self._max_series:
                    self.dropped += 1
                    continue
                self._latest[key] = (p.time_unix_nano, p.value)
                accepted += 1
        return accepted

    def latest(self, node: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        """Newest value of every series of ``name`` on ``node``, keyed by labels."""
        with self._lock:
            return {k.labels: v for k, (_, v) in self._latest.items()
                    if k.node == node and k.name == name}

    def nodes(self) -> set[str]:
        with self._lock:
            return {k.node for k in self._latest}
