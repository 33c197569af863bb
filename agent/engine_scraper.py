"""Scrapes engine /metrics endpoints (vLLM, SGLang) and normalizes them.

A fetch requests every configured URL together with the injected HTTP client
(:meth:`EngineScraper.begin`) and reads the pages afterwards (:meth:`EngineScraper.collect`;
:meth:`EngineScraper.read` does both at once). It keeps only the lines whose name is in
:mod:`tokenpath.agent.engine_names`, parses them
(:mod:`tokenpath.agent.prom_text`) and folds them into
tokenpath's ``engine, model`` series. Counters are made monotonic per source series, so
an engine restart never makes a total go backwards; a dead or garbled endpoint (one
that answers 200 with no sample of a vLLM or SGLang metric the scraper normalizes: an
HTML page, a wrong path) is counted in ``scrape_errors{source="engine:<host:port>"}``,
gets ``engine_up`` 0, keeps its last counter totals, drops its gauges, and is tried
again at the next fetch.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from tokenpath.agent.engine_names import (
    MODEL_LABELS,
    RULES_BY_SOURCE,
    SOURCE_LINE_PREFIXES,
    UNKNOWN_MODEL,
    EngineMetricRule,
)
from tokenpath.agent.http_fetch import HttpClient, HttpResponse, PendingResponse, begin_get
from tokenpath.agent.monotonic import MonotonicCounters
from tokenpath.agent.prom_text import iter_samples
from tokenpath.agent.snapshot import ErrorCounts, LabelValues
from tokenpath.labels import BoundedLabel
from tokenpath.metric_names import COUNTER_SUFFIX, MetricSpec

logger = logging.getLogger(__name__)

# Raw engine series tracked for monotonic accumulation, all endpoints together.
MAX_ENGINE_SOURCE_SERIES = 8192

HTTP_OK = 200

EngineKey = tuple[MetricSpec, LabelValues]


class EngineScrapeError(Exception):
    """An engine endpoint answered, but not with a page."""


def _page_text(response: HttpResponse) -> str:
    if response.status_code != HTTP_OK:
        raise EngineScrapeError(f"HTTP {response.status_code}")
    return response.text


def endpoint_source(url: str) -> str:
    """``engine:<host:port>``: the ``source`` label value for one endpoint."""
    parts = urlsplit(url)
    return f"engine:{parts.netloc or url}"



@dataclass(slots=True)
class EngineReadings:
    """Normalized values from every endpoint at one poll."""

    counters: dict[EngineKey, float] = field(default_factory=dict)
    gauges: dict[EngineKey, float] = field(default_factory=dict)
    up: dict[str, float] = field(default_factory=dict)


RawKey = tuple[str, str, tuple[tuple[str, str], ...]]


@dataclass(slots=True)
class _EndpointState:
    url: str
    source: str
    # Every raw source series ever seen per tokenpath series: the sum of their monotonic
    # totals is the tokenpath total, so a series that vanishes after a restart still
    # counts what it counted before.
    raw_keys: dict[EngineKey, set[RawKey]] = field(default_factory=dict)
    counters: dict[EngineKey, float] = field(default_factory=dict)


class EngineScraper:
    """Polls engine /metrics URLs; never raises into the poll loop."""

    def __init__(
        self,
        urls: Iterable[str],
        client: HttpClient,
        *,
        model_label: BoundedLabel,
    ) -> None:
        self._endpoints = [_EndpointState(url, endpoint_source(url)) for url in urls]
        self._client = client
        self._model_label = model_label
        self._accumulators = MonotonicCounters(MAX_ENGINE_SOURCE_SERIES)
        self._pending: list[PendingResponse] | None = None

    @property
    def urls(self) -> list[str]:
        return [endpoint.url for endpoint in self._endpoints]

    @property
    def restarts_seen(self) -> int:
        return self._accumulators.resets

    @property
    def pending(self) -> bool:
        """Whether requests were sent (:meth:`begin`) and their pages not yet read."""
        return self._pending is not None

    def begin(self) -> None:
        """Sends every endpoint's request now; :meth:`collect` reads the pages."""
        self.cancel()
        self._pending = [begin_get(self._client, endpoint.url) for endpoint in self._endpoints]

    def cancel(self) -> None:
        """Drops requests sent and not read (at shutdown)."""
        pending, self._pending = self._pending, None
        for request in pending or ():
            request.cancel()

    def read(self, errors: ErrorCounts) -> EngineReadings:
        """Requests every page and reads them now."""
        self.begin()
        return self.collect(errors)

    def collect(self, errors: ErrorCounts) -> EngineReadings:
        """Reads the pages requested by :meth:`begin` (requesting them now if it was not
        called) and folds them into readings; failures are counted in ``errors``."""
        if self._pending is None:
            self.begin()
        pending, self._pending = self._pending, None
        assert pending is not None
        readings = EngineReadings()
        gauge_parts: dict[EngineKey, list[float]] = {}
        mean_keys: set[EngineKey] = set()
        for endpoint, request in zip(self._endpoints, pending, strict=True):
            try:
                text = _page_text(request.result())
                gauges = self._parse(endpoint, text, mean_keys)
            except Exception as exc:
                errors.count(endpoint.source)
                logger.debug("engine scrape %s failed: %s", endpoint.url, exc)
                readings.up[endpoint.source] = 0.0
                gauges = {}
            else:
                readings.up[endpoint.source] = 1.0
            for key, total in endpoint.counters.items():
                readings.counters[key] = readings.counters.get(key, 0.0) + total
            for key, value in gauges.items():
                gauge_parts.setdefault(key, []).append(value)
        for key, values in gauge_parts.items():
            combined = sum(values)
            readings.gauges[key] = combined / len(values) if key in mean_keys else combined
        return readings

    def _parse(
        self, endpoint: _EndpointState, text: str, mean_keys: set[EngineKey]
    ) -> dict[EngineKey, float]:
        """Fold one page into the endpoint's counter totals; returns its gauges."""
        gauges: dict[EngineKey, float] = {}
        gauge_counts: dict[EngineKey, int] = {}
        accumulators = self._accumulators
        matched: list[tuple[str, EngineMetricRule, dict[str, str], float]] = []
        for name, labels, value in iter_samples(text, SOURCE_LINE_PREFIXES):
            base = name.removesuffix(COUNTER_SUFFIX)
            rule = RULES_BY_SOURCE.get(base)
            if rule is not None:
                matched.append((base, rule, labels, value))
        if not matched:
            # An engine that has served nothing yet may declare its labelled families
            # without a sample (prometheus_client shows none before .labels()): up.
            if any(f"# TYPE {prefix}" in text for prefix in SOURCE_LINE_PREFIXES):
                return gauges
            raise EngineScrapeError("no vLLM or SGLang engine metrics on the page")
        present = {match[0] for match in matched}
        for base, rule, labels, value in matched:
            if rule.superseded_by is not None and rule.superseded_by in present:
                continue
            model = next((labels[k] for k in MODEL_LABELS if k in labels), UNKNOWN_MODEL)
            values: tuple[str, ...] = (rule.engine, self._model_label(model))
            if rule.label is not None:
                extra = (rule.values or {}).get(labels.get(rule.label, ""))
                if extra is None:
                    continue  # a value outside the rule's table (SGLang's "total", say)
                values = (*values, extra)
            key: EngineKey = (rule.target, values)
            if rule.target.type == "counter":
                raw_key: RawKey = (endpoint.url, base, tuple(sorted(labels.items())))
                if accumulators.update(raw_key, value) is not None:
                    endpoint.raw_keys.setdefault(key, set()).add(raw_key)
            else:
                gauges[key] = gauges.get(key, 0.0) + value
                gauge_counts[key] = gauge_counts.get(key, 0) + 1
                if rule.aggregate == "mean":
                    mean_keys.add(key)
        for key in mean_keys:
            count = gauge_counts.get(key)
            if count:
                gauges[key] /= count
        endpoint.counters = {
            key: sum(accumulators.total(raw) or 0.0 for raw in raws)
            for key, raws in endpoint.raw_keys.items()
        }
        return gauges
