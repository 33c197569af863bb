"""vLLM-format ``/metrics`` for the simulated engines, so a node agent scrapes the
reference path like a real vLLM (prefix-cache query and hit tokens, running and waiting
requests, KV-cache usage). Values are read from the engines at scrape time; the registry
belongs to the server, never prometheus_client's global one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tokenpath import metric_names as names
from tokenpath.instrumentation.reference.engine import SimulatedEngine

LABELS = [names.VLLM_LABEL_MODEL_NAME, names.VLLM_LABEL_ENGINE]


class EngineMetricsCollector(Collector):
    def __init__(self, engines: Sequence[SimulatedEngine]) -> None:
        self._engines = list(engines)

    def collect(self) -> Iterator[Metric]:
        queries = CounterMetricFamily(names.VLLM_PREFIX_CACHE_QUERIES,
                                      "Prefix-cache queries, in tokens (simulated engine).",
                                      labels=LABELS)
        hits = CounterMetricFamily(names.VLLM_PREFIX_CACHE_HITS,
                                   "Prefix-cache hits, in tokens (simulated engine).",
                                   labels=LABELS)
        running = GaugeMetricFamily(names.VLLM_NUM_REQUESTS_RUNNING,
                                    "Requests in the running batch (simulated engine).",
                                    labels=LABELS)
        waiting = GaugeMetricFamily(names.VLLM_NUM_REQUESTS_WAITING,
                                    "Requests waiting to be scheduled (simulated engine).",
                                    labels=LABELS)
        usage = GaugeMetricFamily(names.VLLM_KV_CACHE_USAGE,
                                  "KV-cache usage, 1 = full (simulated engine).", labels=LABELS)
        for engine in self._engines:
            labels = [engine.config.model, engine.config.replica]
            stats = engine.kv.stats
            queries.add_metric(labels, float(stats.query_tokens))
            hits.add_metric(labels, float(stats.hit_tokens))
            running.add_metric(labels, float(len(engine.scheduler.running)))
            waiting.add_metric(labels, float(len(engine.scheduler.waiting)))
            usage.add_metric(labels, engine.kv.usage_ratio)
        yield from (queries, hits, running, waiting, usage)


def engine_registry(engines: Sequence[SimulatedEngine]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineMetricsCollector(engines))
    return registry
