"""OTLP metrics (what the node agent pushes) reach the collector's node-metrics state."""

from __future__ import annotations

import pytest
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
    OTLPMetricExporter as GrpcMetricExporter,
)
from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
    OTLPMetricExporter as HttpMetricExporter,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from tokenpath import attributes as A
from tokenpath import metric_names as M
from tokenpath.collector.config import CollectorConfig
from tokenpath.collector.service import CollectorService


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_agent_style_metrics_are_kept_per_node(transport: str) -> None:
    service = CollectorService(CollectorConfig(http_port=0, grpc_port=0))
    service.start()
    try:
        exporter: MetricExporter
        if transport == "http":
            exporter = HttpMetricExporter(endpoint=f"{service.http_url}/v1/metrics")
        else:
            exporter = GrpcMetricExporter(endpoint=service.grpc_endpoint, insecure=True)
        reader = PeriodicExportingMetricReader(exporter, export_interval_millis=60_000)
        provider = MeterProvider(resource=Resource.create({A.NODE: "gpu-node-1"}),
                                 metric_readers=[reader])
        meter = provider.get_meter("tokenpath.agent")
        busy = meter.create_counter(M.GPU_BUSY_SECONDS.series)
        busy.add(12.5, {M.LABEL_GPU: "0"})
        busy.add(3.0, {M.LABEL_GPU: "1"})
        provider.shutdown()
        latest = service.node_metrics.latest("gpu-node-1", M.GPU_BUSY_SECONDS.series)
        assert latest == {((M.LABEL_GPU, "0"),): 12.5, ((M.LABEL_GPU, "1"),): 3.0}
        assert service.stats.metric_points_received[f"otlp_{transport}"] == 2
    finally:
        service.shutdown()
