"""Prometheus exposition of the latest poll: a custom collector on the agent's registry.

The collector renders whatever :class:`Snapshot` its source returns; scrapes never touch
NVML, psutil or the engines, so a scrape is cheap and every scraper sees the same poll.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tokenpath.agent.snapshot import Snapshot
from tokenpath.metric_names import AGENT_METRICS, MetricSpec


class AgentCollector(Collector):
    """Yields every agent metric family (HELP/TYPE even when it has no series yet)."""

    def __init__(
        self,
        latest: Callable[[], Snapshot | None],
        metrics: tuple[MetricSpec, ...] = AGENT_METRICS,
    ) -> None:
        self._latest = latest
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        snapshot = self._latest()
        points = snapshot.points if snapshot is not None else {}
        for spec in self._metrics:
            family: CounterMetricFamily | GaugeMetricFamily
            if spec.type == "counter":
                family = CounterMetricFamily(spec.name, spec.help, labels=spec.labels)
            else:
                family = GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)
            for labels, value in points.get(spec, {}).items():
                family.add_metric(labels, value)
            yield family
