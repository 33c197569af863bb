"""End to end through the collector: vLLM-shaped engine spans from the step simulator go
over OTLP/HTTP into CollectorService; the stored records carry apportioned dollars close to
the simulator's ground truth, and the report has real cost values."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from tokenpath import attributes as A
from tokenpath import views
from tokenpath.collector.config import CollectorConfig
from tokenpath.collector.cost.accuracy import compare_to_ground_truth
from tokenpath.collector.cost.prices import load_price_sheet
from tokenpath.collector.cost.stepsim import SimResult, random_workload, simulate
from tokenpath.collector.service import CollectorService
from tokenpath.collector.store.factory import open_store_readonly
from tokenpath.query import Window
from tokenpath.roofline import roofline_for
from tokenpath.stages import StageId

pytestmark = pytest.mark.integration

NODE = "sim-node-0"


def _emit_engine_spans(result: SimResult, endpoint: str, offset: float) -> None:
    provider = TracerProvider(resource=Resource.create({A.NODE: NODE}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    tracer = provider.get_tracer("stepsim")
    for record in result.records:
        assert record.prefill_seconds is not None and record.decode_seconds is not None
        assert record.queue_seconds is not None and record.engine_end_unix is not None
        span = tracer.start_span(A.VLLM_REQUEST_SPAN_NAME,
                                 start_time=int((record.start_unix + offset) * 1e9))
        span.set_attributes({
            A.GEN_AI_REQUEST_MODEL: record.model,
            A.VLLM_USAGE_PROMPT_TOKENS: record.input_tokens,
            A.VLLM_USAGE_COMPLETION_TOKENS: record.output_tokens,
            A.CACHED_TOKENS: record.cache_read_tokens,
            A.VLLM_LATENCY_TIME_IN_QUEUE: record.queue_seconds,
            A.VLLM_LATENCY_TIME_IN_MODEL_PREFILL: record.prefill_seconds,
            A.VLLM_LATENCY_TIME_IN_MODEL_DECODE: record.decode_seconds,
            A.NODE: NODE,
            A.POOL: "sim",
            A.GPU_TYPE: "H100-SXM",
            A.TENSOR_PARALLEL: 1,
            A.SIMULATED: True,
            A.ENGINE: "simulated",
        })
        span.end(end_time=int((record.engine_end_unix + offset) * 1e9))
    assert provider.force_flush(30_000)
    provider.shutdown()


def test_collector_attributes_cost_close_to_ground_truth(tmp_path: Path) -> None:
    prices = load_price_sheet()
    result = simulate(random_workload(21, 120, 4.0), roofline_for("H100-SXM", "llama-3.1-8b"),
                      prices.gpus["H100-SXM"].dollars_per_second, node=NODE)
    offset = time.time() - result.window[1] - 5.0  # the workload just happened
    store = tmp_path / "store.db"
    service = CollectorService(CollectorConfig(http_port=0, grpc_port=None,
                                               store_path=str(store)))
    service.start()
    try:
        _emit_engine_spans(result, f"{service.http_url}/v1/traces", offset)
        deadline = time.monotonic() + 30
        while sum(service.stats.spans_received.values()) < len(result.records):
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
    finally:
        service.shutdown()
    reader = open_store_readonly(str(store))
    try:
        records = reader.records()
        report = views.report_view(reader, Window()).to_json()
    finally:
        reader.shutdown()
    assert len(records) == len(result.records)
    # trace ids come from the SDK: pair requests by their engine end time instead
    truth_in_end_order = [t for _, t in sorted(
        zip(result.records, result.ground_truth, strict=True),
        key=lambda pair: (round(pair[0].engine_end_unix or 0.0, 3), pair[0].input_tokens,
                          pair[0].output_tokens, pair[0].cache_read_tokens))]
    stored_in_end_order = sorted(records, key=lambda r: (
        round((r.engine_end_unix or 0.0) - offset, 3), r.input_tokens, r.output_tokens,
        r.cache_read_tokens))
    truth = [{**t, "trace_id": r.trace_id}
             for r, t in zip(stored_in_end_order, truth_in_end_order, strict=True)]
    summary = compare_to_ground_truth(records, truth)
    assert summary["median_rel_error"] <= 0.05
    assert summary["median_rel_error"] <= 0.1 * summary["naive_median_rel_error"]
    assert report["cost_dollars"] > 0
    assert report["cost_per_million_output_tokens"] > 0
    stages = {s["stage"]: s for s in report["stages"]}
    assert stages[StageId.KERNEL_EXEC.value]["cost_dollars"] > 0
    assert stages[StageId.HBM_LOAD.value]["cost_dollars"] > 0
