"""OTLP metrics (what the node agent pushes) reach the collector's node-metrics state."""

from __future__ import annotations

import grpc
import httpx
import pytest
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
    OTLPMetricExporter as GrpcMetricExporter,
)
from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
    OTLPMetricExporter as HttpMetricExporter,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from tokenpath import attributes as A
from tokenpath import metric_names as M
from tokenpath.collector.config import CollectorConfig
from tokenpath.collector.receivers.grpc import EXPORT_METHOD, METRICS_SERVICE
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


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_points_over_the_series_limit_are_reported_as_partial_success(
        transport: str) -> None:
    service = CollectorService(CollectorConfig(http_port=0, grpc_port=0))
    service.node_metrics._max_series = 2  # the state's cap, small for the test
    service.start()
    try:
        request = ExportMetricsServiceRequest()
        resource_metrics = request.resource_metrics.add()
        resource_metrics.resource.attributes.add(key=A.NODE).value.string_value = "node-1"
        metric = resource_metrics.scope_metrics.add().metrics.add()
        metric.name = M.GPU_BUSY_SECONDS.series
        for gpu in ("0", "1", "2"):
            point = metric.gauge.data_points.add(as_double=1.0)
            point.attributes.add(key=M.LABEL_GPU).value.string_value = gpu
        body = request.SerializeToString()
        if transport == "http":
            answer = httpx.post(f"{service.http_url}/v1/metrics", content=body, timeout=5,
                                headers={"Content-Type": "application/x-protobuf"})
            assert answer.status_code == 200
            response = ExportMetricsServiceResponse.FromString(answer.content)
        else:
            with grpc.insecure_channel(service.grpc_endpoint) as channel:
                raw = channel.unary_unary(f"/{METRICS_SERVICE}/{EXPORT_METHOD}")(body, timeout=5)
            response = ExportMetricsServiceResponse.FromString(raw)
        assert response.partial_success.rejected_data_points == 1
        assert "series limit" in response.partial_success.error_message
        assert service.stats.metric_points_dropped["max_series"] == 1
    finally:
        service.shutdown()
