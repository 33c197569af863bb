"""The reference path's disaggregated mode through the real collector: each request one
record naming its prefill and decode engines; each engine's part of its GPU dollars within
5% (median) of what that engine's ground truth says; each node's dollars conserved; the
KV transfer's bytes those the simulator sent."""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from testkit.support.reference_client import drive_chat
from tokenpath import metric_names as M
from tokenpath.collector.config import CollectorConfig
from tokenpath.collector.service import CollectorService
from tokenpath.collector.store.factory import open_store_readonly
from tokenpath.instrumentation.reference.engine import EngineConfig
from tokenpath.instrumentation.reference.ground_truth import (
    GroundTruthWriter,
    read_ground_truth_rows,
)
from tokenpath.instrumentation.reference.serving_path import (
    ReferencePathConfig,
    ReferenceServingPath,
)
from tokenpath.instrumentation.reference.workload import WorkloadConfig, WorkloadGenerator
from tokenpath.records import RequestRecord
from tokenpath.stages import GPU_STAGES, Phase

pytestmark = pytest.mark.integration

MODEL = "llama-3.1-8b"
GPU_DOLLARS_PER_HOUR = 4.0
REQUESTS = 40
CONCURRENCY = 8


def phase_dollars(record: RequestRecord, phase: Phase) -> float:
    return sum(record.stages[s].phases[phase].cost_dollars for s in GPU_STAGES
               if s in record.stages and phase in record.stages[s].phases)


def test_disaggregated_reference_path_matches_each_engines_ground_truth(
        tmp_path: Path) -> None:
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
    truth = GroundTruthWriter(truth_path)
    truth.start()
    path = ReferenceServingPath(ReferencePathConfig(
        engine=EngineConfig(model=MODEL, gpu_dollars_per_hour=GPU_DOLLARS_PER_HOUR),
        disaggregated=True), tracer_provider=provider, ground_truth=truth)
    path.start()
    generator = WorkloadGenerator(WorkloadConfig(long_context_share=0.1))
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
    metrics = service.prometheus.render()  # after the attributor's last records
    ledger = service.attributor.ledger
    reader = open_store_readonly(str(tmp_path / "store.db"))
    try:
        records = reader.records()
    finally:
        reader.shutdown()
    by_trace: dict[str, list[dict[str, object]]] = {}
    for row in read_ground_truth_rows(truth_path):
        by_trace.setdefault(str(row["trace_id"]), []).append(row)
    served = [r for r in records if r.trace_id in by_trace and r.complete]
    assert len(served) >= 0.9 * REQUESTS
    assert len({r.trace_id for r in served}) == len(served)  # one record per request
    errors: dict[Phase, list[float]] = {Phase.PREFILL: [], Phase.DECODE: []}
    assert path.disaggregated is not None
    for record in served:
        rows = {str(row["engine"]).split("-")[0]: row for row in by_trace[record.trace_id]}
        assert set(rows) == {"prefill", "decode"}
        assert record.prefill_engine_id == rows["prefill"]["engine"]
        assert record.decode_engine_id == rows["decode"]["engine"]
        assert record.prefill_node == rows["prefill"]["node"]
        assert record.decode_node == rows["decode"]["node"]
        # the transfer's bytes are the simulator's
        assert record.kv_transfer_tokens == rows["decode"]["kv_transfer_tokens"]
        assert record.kv_transfer_bytes == rows["decode"]["kv_transfer_bytes"]
        for phase, role in ((Phase.PREFILL, "prefill"), (Phase.DECODE, "decode")):
            truth_dollars = float(rows[role]["gpu_cost_dollars"])  # type: ignore[arg-type]
            if truth_dollars > 0:
                errors[phase].append(abs(phase_dollars(record, phase) - truth_dollars)
                                     / truth_dollars)
    for phase, found in errors.items():
        assert len(found) >= 0.9 * len(served)
        assert statistics.median(found) <= 0.05, (phase, statistics.median(found))
    assert sum(r.kv_transfer_bytes or 0 for r in served) <= path.disaggregated.transferred_bytes
    # every node's busy time is paid by the requests it served, or is idle
    assert any("prefill" in name for name in ledger) and any("decode" in name
                                                             for name in ledger)
    for name, node in ledger.items():
        assert math.isclose(node.node_dollars, node.attributed_dollars + node.idle_dollars,
                            rel_tol=1e-9, abs_tol=1e-12), name
    assert f"{M.KV_TRANSFER_BYTES.series}{{" in metrics
