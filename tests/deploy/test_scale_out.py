"""Scale-out, priced exactly: three `tokenpath collector` processes behind a router that
does what the OpenTelemetry Collector's loadbalancing exporter does (spans by trace id,
record logs by their resource), each forwarding its mapped records (--forward-records),
price the same engine traffic to the dollar of one collector: overlapping engine
timelines at real batch sizes, from two vLLM engines known only by their resource and the
demo's engine (tests/deploy/engine_traffic.py)."""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.cluster import (
    Cluster,
    assert_same_slo,
    cluster,
    post,
    report,
    samples,
    slo_digests,
)
from tests.deploy.engine_traffic import engine_traffic, peak_in_flight
from tests.deploy.hash_ring import HashRing
from tokenpath import metric_names as mn
from tokenpath.collector.store.factory import open_store_readonly
from tokenpath.records import RequestRecord

pytestmark = pytest.mark.integration

PER_ENGINE = 100
MIN_PEAK_IN_FLIGHT = 32


def _stored(store: Path) -> tuple[dict[str, RequestRecord], list[tuple[float, float, float]]]:
    reader = open_store_readonly(str(store))
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        records = {r.trace_id: r for r in reader.records()}
        idle = [tuple(row) for row in db.execute(
            "SELECT start_unix, end_unix, dollars FROM idle_cost")]
    finally:
        db.close()
        reader.shutdown()
    return records, idle  # type: ignore[return-value]


def _idle_within(idle: list[tuple[float, float, float]], start: float, end: float) -> float:
    """Idle dollars within ``[start, end]``. A stored row is one rate (dollars per second)
    over its time, so the part of a row inside the window counts pro rata, exactly."""
    total = 0.0
    for a, b, dollars in idle:
        overlap = min(b, end) - max(a, start)
        if overlap > 0 and b > a:
            total += dollars * overlap / (b - a)
    return total


@pytest.fixture(name="cluster")
def _cluster(tmp_path: Path) -> Iterator[Cluster]:
    with cluster(tmp_path) as running:
        yield running


def test_three_forwarding_collectors_price_like_one(cluster: Cluster) -> None:
    single, shards, router = cluster.single, cluster.shards, cluster.router
    traffic = engine_traffic(time.time(), per_engine=PER_ENGINE)
    total = len(traffic.trace_ids)
    body = traffic.request.SerializeToString()
    post(f"{single.http_url}/v1/traces", body)
    post(f"{router.url}/v1/traces", body)

    cluster.wait_priced(total)
    late = mn.RECORDS_LATE.series
    assert samples(single.http_url).get(late) == 0
    assert all(samples(s.http_url).get(late) == 0 for s in shards)
    forwarded = sum(samples(s.http_url).get(mn.RECORDS_FORWARDED.series, 0.0)
                    for s in shards)
    assert forwarded == total
    assert sum(router.logs_routed.values()) == total

    merged = report("--collector", ",".join(s.http_url for s in shards))
    alone_report = report("--collector", single.http_url)
    assert merged["requests"] == alone_report["requests"] == total
    assert math.isclose(merged["cost_dollars"], alone_report["cost_dollars"], rel_tol=1e-6)
    # the SLO classes: every replica runs the same ones (one digest), and the replicas'
    # records give the goodput and dollars per good request of one collector
    digests = {d for p in cluster.processes for d in slo_digests(p.http_url)}
    assert len(digests) == 1
    slo = merged["slo"]
    assert slo["met"] and slo["missed"] and {c["slo"] for c in slo["classes"]} == {
        "chat", "batch"}
    assert slo["met"] + slo["missed"] + slo["unknown"] == total
    assert_same_slo(slo, alone_report["slo"], 1e-6)
    # none of these engines is in the price sheet's inventory, and the report says so
    assert len(merged["units_without_inventory"]) == 3

    for process in cluster.processes:
        process.stop()  # flush; the stores then hold everything
    alone, alone_idle = _stored(single.store)
    sharded: dict[str, RequestRecord] = {}
    sharded_idle: list[tuple[float, float, float]] = []
    priced_on: dict[str, set[int]] = {}
    for index, shard in enumerate(shards):
        records, idle = _stored(shard.store)
        assert not set(records) & set(sharded)  # priced once, on one replica
        sharded.update(records)
        sharded_idle.extend(idle)
        for record in records.values():
            priced_on.setdefault(record.node or record.engine_id or "", set()).add(index)
    # every record of one unit was priced on one replica (which one is the hash's choice)
    assert all(len(replicas) == 1 for replicas in priced_on.values()), priced_on
    assert set(alone) == set(sharded) == set(traffic.trace_ids)

    # the hard path was exercised: GPU dollars on every record, three engines told apart
    # by what they sent, each with dozens of requests in flight at once
    assert all(r.gpu_cost_dollars > 0 for r in alone.values())
    units = {r.node or r.engine_id for r in alone.values()}
    assert len(units) == 3 and "gpu-node-1" in units
    for unit in units:
        assert peak_in_flight([r for r in alone.values()
                                if (r.node or r.engine_id) == unit]) >= MIN_PEAK_IN_FLIGHT
    for trace_id, record in alone.items():
        assert math.isclose(sharded[trace_id].gpu_cost_dollars, record.gpu_cost_dollars,
                            rel_tol=1e-6), trace_id
    gpu_alone = sum(r.gpu_cost_dollars for r in alone.values())
    gpu_sharded = sum(r.gpu_cost_dollars for r in sharded.values())
    # Idle is compared while every unit is inside its own traffic: from the first engine
    # start to the earliest unit's last engine end. There each unit's slices are cut by its
    # records alone. After a unit's last record its idle runs on only as far as its
    # watermark went, which for a quiet unit follows the wall clock (min_delay_seconds
    # after its last arrival), so how much of it a collector had closed when it stopped
    # depends on the machine's load, not on the pricing.
    start, _ = traffic.window
    end = min(max(r.engine_end_unix or 0.0 for r in alone.values()
                  if (r.node or r.engine_id) == unit) for unit in units)
    idle_alone = _idle_within(alone_idle, start, end)
    idle_sharded = _idle_within(sharded_idle, start, end)
    assert idle_alone > 0
    assert math.isclose(gpu_sharded, gpu_alone, rel_tol=1e-6)
    assert math.isclose(idle_sharded, idle_alone, rel_tol=1e-6)


def test_a_vllm_annotation_naming_its_trace_is_routed_with_its_request() -> None:
    """The plugin's annotation follows the request id's trace onto the ring: it reaches
    the replica holding the request's llm_request span. One without falls anywhere."""
    import os

    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanContext

    from tokenpath.attributes import GEN_AI_REQUEST_ID
    from tokenpath.instrumentation.request_ids import request_id_for
    from tokenpath.instrumentation.vllm.config import PluginConfig
    from tokenpath.instrumentation.vllm.exporter import AnnotationExporter, FinishedRequest

    ring = HashRing([f"collector-{i}:4317" for i in range(3)])
    sink = InMemorySpanExporter()
    exporter = AnnotationExporter(PluginConfig(), sink, clock=lambda: 100.0)
    requests = {}
    for i in range(300):
        trace_id = os.urandom(16)
        gateway = SpanContext(int.from_bytes(trace_id, "big"), i + 1, is_remote=True)
        request_id = f"chatcmpl-{request_id_for(gateway)}"
        requests[request_id] = trace_id
        exporter.submit(FinishedRequest(request_id, 100.0, 0, 0, 10, 5, 0.5, "stop"))
    exporter.shutdown()
    annotations = sink.get_finished_spans()
    assert len(annotations) == len(requests)
    for span in annotations:
        assert span.context is not None and span.attributes is not None
        request_trace = requests[str(span.attributes[GEN_AI_REQUEST_ID])]
        annotation_trace = span.context.trace_id.to_bytes(16, "big")
        assert ring.endpoint_for(annotation_trace) == ring.endpoint_for(request_trace)
