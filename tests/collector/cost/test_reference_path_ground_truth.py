"""The reference serving path's simulated engine writes ground truth;
its spans go through the real collector; each complete request's GPU cost (gpu_dispatch +
hbm_load + kernel_exec + nvlink) is within 5% median of the truth and <= 0.1x the naive
wall-clock error."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from testkit.support.reference_client import drive_chat
from tokenpath import views
from tokenpath.collector.config import CollectorConfig
from tokenpath.collector.cost.accuracy import compare_to_ground_truth
from tokenpath.collector.service import CollectorService
from tokenpath.collector.store.factory import open_store_readonly
from tokenpath.query import Window

serving_path = pytest.importorskip("tokenpath.instrumentation.reference.serving_path")
engine_module = pytest.importorskip("tokenpath.instrumentation.reference.engine")
ground_truth_module = pytest.importorskip("tokenpath.instrumentation.reference.ground_truth")
workload_module = pytest.importorskip("tokenpath.instrumentation.reference.workload")

pytestmark = pytest.mark.integration

MODEL = "llama-3.1-8b"
GPU_DOLLARS_PER_HOUR = 4.0
REQUESTS = 60
CONCURRENCY = 8


def test_reference_path_cost_matches_engine_ground_truth(tmp_path: Path) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text(f"gpus: {{H100-SXM: {{dollars_per_hour: {GPU_DOLLARS_PER_HOUR}}}}}\n")
    service = CollectorService(CollectorConfig(
        http_port=0, grpc_port=None, store_path=str(tmp_path / "store.db"),
        prices_path=str(prices)))
    service.start()
    provider = TracerProvider()
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{service.http_url}/v1/traces")))
    truth_path = tmp_path / "ground_truth.jsonl"
    truth = ground_truth_module.GroundTruthWriter(truth_path)
    truth.start()
    engine = engine_module.EngineConfig(model=MODEL, time_scale=1.0,
                                        gpu_dollars_per_hour=GPU_DOLLARS_PER_HOUR)
    path = serving_path.ReferenceServingPath(
        serving_path.ReferencePathConfig(engine=engine), tracer_provider=provider,
        ground_truth=truth)
    path.start()
    generator = workload_module.WorkloadGenerator(
        workload_module.WorkloadConfig(long_context_share=0.1))
    requests = [generator.next_request() for _ in range(REQUESTS)]

    try:
        drive_chat(path.base_url, provider, requests, MODEL, CONCURRENCY)
    finally:
        path.shutdown()
        assert provider.force_flush(30_000)
        provider.shutdown()
        time.sleep(1.5)  # the assembler's root grace
        service.shutdown()
        truth.shutdown()
    reader = open_store_readonly(str(tmp_path / "store.db"))
    try:
        records = reader.records()
        report = views.report_view(reader, Window()).to_json()
    finally:
        reader.shutdown()
    summary = compare_to_ground_truth(records, truth_path)
    assert summary["matched"] >= 0.9 * REQUESTS
    assert summary["median_rel_error"] <= 0.05
    assert summary["median_rel_error"] <= 0.1 * summary["naive_median_rel_error"]
    assert report["cost_dollars"] > 0 and report["cost_per_million_output_tokens"] > 0
