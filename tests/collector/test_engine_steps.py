"""The vLLM plugin's engine-steps interval spans reach the collector's telemetry: sent by
the real plugin exporter over OTLP/HTTP, read per engine, not counted as unmapped spans."""

from __future__ import annotations

import time

import httpx
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from prometheus_client.parser import text_string_to_metric_families

from tokenpath import metric_names as M
from tokenpath.collector.config import CollectorConfig
from tokenpath.collector.service import CollectorService
from tokenpath.instrumentation.vllm.config import PluginConfig
from tokenpath.instrumentation.vllm.exporter import AnnotationExporter, EngineStep


def _samples(body: str, series: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name == series:
                out[sample.labels[M.LABEL_ENGINE]] = sample.value
    return out


def test_engine_steps_spans_become_per_engine_telemetry() -> None:
    service = CollectorService(CollectorConfig(http_port=0, grpc_port=None))
    service.start()
    try:
        otlp = OTLPSpanExporter(endpoint=f"{service.http_url}/v1/traces")
        plugin = AnnotationExporter(PluginConfig(queue_size=2, node="gpu-node-1"), otlp,
                                    clock=lambda: time.time())
        assert plugin.submit(EngineStep(time.time() - 1.0, 5, 0, 1, None))
        assert plugin.submit(EngineStep(time.time() - 0.5, 0, 2, 2, None))
        assert not plugin.submit(EngineStep(time.time(), 0, 2, 2, None))  # queue full
        plugin.shutdown()  # the interval summary goes out
        telemetry = service.mapper.engine_steps
        deadline = time.monotonic() + 30
        while not telemetry.steps and time.monotonic() < deadline:
            time.sleep(0.05)
        body = httpx.get(f"{service.http_url}/metrics", timeout=10).text
    finally:
        service.shutdown()
    steps = _samples(body, M.ENGINE_PLUGIN_STEPS.series)
    assert list(steps.values()) == [2.0]
    (engine,) = steps
    assert _samples(body, M.ENGINE_PLUGIN_STEP_SECONDS.series)[engine] > 0
    assert _samples(body, M.ENGINE_PLUGIN_EXPORT_DROPPED.series) == {engine: 1.0}
    assert service.stats.spans_unmapped.value == 0


def test_non_finite_or_negative_step_figures_are_not_counted() -> None:
    from testkit.fakes.spans import new_trace_id, span
    from tokenpath import attributes as A
    from tokenpath.collector.engine_steps import EngineStepsTelemetry

    telemetry = EngineStepsTelemetry()
    for seconds, steps in ((float("inf"), -3), (float("nan"), 2), (0.25, 4)):
        telemetry.observe(span(new_trace_id(), A.SPAN_ENGINE_STEPS, attributes={
            A.STEP_SECONDS: seconds, A.STEP_COUNT: steps, A.ENGINE_ID: "e1"}))
    assert telemetry.step_seconds == {"e1": 0.25}
    assert telemetry.steps == {"e1": 6.0}
