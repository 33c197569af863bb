"""``tokenpath_build_info`` and ``tokenpath_build_fallbacks_total``: what this install runs
(:mod:`tokenpath.install_check`), as a custom collector on a component's own registry."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tokenpath import metric_names as M
from tokenpath.install_check import BuildState


class BuildInfoCollector:
    """Yields the build's info gauge and one fallback count per part running as Python.
    prometheus-client calls :meth:`collect` at scrape time."""

    def __init__(self, state: BuildState) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        state = self._state
        info = GaugeMetricFamily(M.BUILD_INFO.name, M.BUILD_INFO.help,
                                 labels=list(M.BUILD_INFO.labels))
        info.add_metric([state.version, state.core, state.decoder], 1.0)
        yield info
        fallbacks = CounterMetricFamily(M.BUILD_FALLBACKS.name, M.BUILD_FALLBACKS.help,
                                        labels=list(M.BUILD_FALLBACKS.labels))
        for fallback in state.fallbacks:
            fallbacks.add_metric([fallback.component, fallback.reason], 1.0)
        yield fallbacks
