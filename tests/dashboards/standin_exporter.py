"""Stand-in metrics source for the live Prometheus test, until the demo and the agent are on
main: a synthetic workload turned into RequestRecords and fed to the collector's real
PrometheusSink (so names, labels and buckets are the collector's own), plus agent-shaped
metrics from the specs in tokenpath.metric_names, each served on loopback.

Modeled numbers: the workload is synthetic (fixed token counts, stage times and prices).
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
    start_http_server,
)

from tokenpath import metric_names as mn
from tokenpath.collector.prometheus_sink import PrometheusSink
from tokenpath.pipeline import IdleCost
from tokenpath.records import PhaseShare, RequestRecord, StageTiming
from tokenpath.stages import STAGES, Phase, Provenance

MODEL = "standin-model"
POOL = "standin-pool"
GPU = "0"
NIC = "standin0"
INPUT_TOKENS = 1000
OUTPUT_TOKENS = 100
REPEATED_HIT_SHARE = 0.8
STAGE_SECONDS = 0.004
STAGE_DOLLARS = 1e-5
CONTEXT_BUCKETS = ("0-4k", "4k-32k")
TICK_SECONDS = 0.25
REQUESTS_PER_TICK = 4


def _record(index: int, unique_prompts: bool) -> RequestRecord:
    cached = 0 if unique_prompts else int(INPUT_TOKENS * REPEATED_HIT_SHARE)
    stages = {}
    for stage in STAGES:
        half = PhaseShare(seconds=STAGE_SECONDS / 2, cost_dollars=STAGE_DOLLARS / 2)
        stages[stage.id] = StageTiming(
            stage=stage.id, seconds=STAGE_SECONDS * (1 + stage.order % 3),
            provenance=Provenance.MEASURED, cost_dollars=STAGE_DOLLARS,
            phases={Phase.PREFILL: half, Phase.DECODE: PhaseShare(half.seconds,
                                                                  half.cost_dollars)})
    waste = 0.0 if not unique_prompts else STAGE_DOLLARS * 3
    return RequestRecord(
        trace_id=f"{index:032x}", model=MODEL, pool=POOL, input_tokens=INPUT_TOKENS,
        cache_read_tokens=cached, output_tokens=OUTPUT_TOKENS,
        ttft_seconds=0.2 + 0.02 * (index % 5) + (0.3 if unique_prompts else 0.0),
        tpot_seconds=0.01, response_chunks=OUTPUT_TOKENS, small_chunks=OUTPUT_TOKENS // 2,
        stages=stages, cost_dollars=STAGE_DOLLARS * len(STAGES),
        naive_cost_dollars=STAGE_DOLLARS * len(STAGES) * 2, cache_miss_waste_dollars=waste)


class StandInExporter:
    """Serves a collector-shaped and an agent-shaped /metrics on two loopback ports."""

    def __init__(self) -> None:
        self.collector_registry = CollectorRegistry()
        self.agent_registry = CollectorRegistry()
        self._sink = PrometheusSink(registry=self.collector_registry)
        # Metrics the collector on main does not emit yet (cost issue 4/9).
        self._extra_registry = CollectorRegistry()
        self._context_cost = Counter(mn.LONG_CONTEXT_COST.name, mn.LONG_CONTEXT_COST.help,
                                     mn.LONG_CONTEXT_COST.labels,
                                     registry=self._extra_registry)
        self._agent: dict[str, Any] = {}
        for spec in mn.AGENT_METRICS:
            kind = Counter if spec.type == "counter" else Gauge
            self._agent[spec.name] = kind(spec.name, spec.help, spec.labels,
                                          registry=self.agent_registry)
        self.unique_prompts = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="standin-workload", daemon=True)
        self._servers: list[Any] = []
        self.collector_port = 0
        self.agent_port = 0
        self._count = 0

    def collector_metrics_text(self) -> str:
        """What the collector's /metrics serves (its sink's render) plus the stand-in extras."""
        return self._sink.render() + generate_latest(self._extra_registry).decode("utf-8")

    def _collector_server(self) -> ThreadingHTTPServer:
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                body = exporter.collector_metrics_text().encode("utf-8")
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    def start(self) -> None:
        self._servers.append(self._collector_server())
        agent_server, _ = start_http_server(0, addr="127.0.0.1", registry=self.agent_registry)
        self._servers.append(agent_server)
        self.collector_port = self._servers[0].server_port
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
        unique = self.unique_prompts.is_set()
        for _ in range(REQUESTS_PER_TICK):
            self._count += 1
            self._sink.consume_record(_record(self._count, unique))
            bucket = CONTEXT_BUCKETS[self._count % len(CONTEXT_BUCKETS)]
            self._context_cost.labels(MODEL, bucket).inc(STAGE_DOLLARS * len(STAGES))
        now = time.time()
        self._sink.consume_idle_cost(IdleCost(POOL, now - TICK_SECONDS, now, 1e-4))
        self._agent_tick()

    def _agent_tick(self) -> None:
        for spec in mn.AGENT_METRICS:
            metric = self._agent[spec.name]
            labels = {label: {mn.LABEL_GPU: GPU, mn.LABEL_DEVICE: NIC, mn.LABEL_MODEL: MODEL}
                      .get(label, "standin") for label in spec.labels}
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
