"""Stand-in metrics for the live Prometheus test, for the parts not on main yet:

- agent-shaped metrics (every spec in ``AGENT_METRICS``) until the agent (5/9) lands;
- the cost metrics the collector on main does not emit yet (its attributor passes records
  through until cost attribution, 4/9, lands): dollars by stage and phase, idle dollars
  by pool, dollars by context-length bucket.

Both are served from prometheus_client registries on loopback. Numbers are synthetic
(modeled), not measured. Request metrics (tokens, TTFT, stage durations, chunks) come from
a real `tokenpath collector` process fed OTLP spans (tests/dashboards/otlp_workload.py).
"""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from tokenpath import metric_names as mn
from tokenpath.stages import STAGES, Phase

POOL = "standin-pool"
GPU = "0"
NIC = "standin0"
STAGE_DOLLARS = 1e-5
IDLE_DOLLARS_PER_TICK = 1e-4
CONTEXT_BUCKETS = ("0-4k", "4k-32k")
TICK_SECONDS = 0.25
STANDIN_COST_METRICS = (mn.COST, mn.IDLE_COST, mn.LONG_CONTEXT_COST)


class StandInExporter:
    """Serves a cost-shaped and an agent-shaped /metrics on two loopback ports."""

    def __init__(self, model: str) -> None:
        self._model = model
        self.cost_registry = CollectorRegistry()
        self.agent_registry = CollectorRegistry()
        self._cost: dict[str, Counter] = {
            spec.name: Counter(spec.name, spec.help, spec.labels, registry=self.cost_registry)
            for spec in STANDIN_COST_METRICS}
        self._agent: dict[str, Any] = {}
        for spec in mn.AGENT_METRICS:
            kind = Counter if spec.type == "counter" else Gauge
            self._agent[spec.name] = kind(spec.name, spec.help, spec.labels,
                                          registry=self.agent_registry)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="standin-metrics", daemon=True)
        self._servers: list[Any] = []
        self.cost_port = 0
        self.agent_port = 0
        self._ticks = 0

    def start(self) -> None:
        for registry in (self.cost_registry, self.agent_registry):
            server, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
            self._servers.append(server)
        self.cost_port = self._servers[0].server_port
        self.agent_port = self._servers[1].server_port
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for server in self._servers:
            server.shutdown()
            server.server_close()
        self._servers.clear()

    def _tick(self) -> None:
        self._ticks += 1
        cost = self._cost[mn.COST.name]
        for stage in STAGES:
            for phase in Phase:
                cost.labels(stage.id.value, phase.value, self._model).inc(STAGE_DOLLARS)
        self._cost[mn.IDLE_COST.name].labels(POOL).inc(IDLE_DOLLARS_PER_TICK)
        bucket = CONTEXT_BUCKETS[self._ticks % len(CONTEXT_BUCKETS)]
        self._cost[mn.LONG_CONTEXT_COST.name].labels(self._model, bucket).inc(STAGE_DOLLARS)
        for spec in mn.AGENT_METRICS:
            metric = self._agent[spec.name]
            labels = {label: {mn.LABEL_GPU: GPU, mn.LABEL_DEVICE: NIC,
                              mn.LABEL_MODEL: self._model}.get(label, "standin")
                      for label in spec.labels}
            child = metric.labels(**labels) if labels else metric
            if spec.type == "counter":
                child.inc(1000.0)
            elif spec == mn.AGENT_NVML_UP:
                child.set(1)
            else:
                child.set(0.5 if spec.name.endswith("ratio") else 1000.0)

    def _run(self) -> None:
        while not self._stop.wait(TICK_SECONDS):
            self._tick()
