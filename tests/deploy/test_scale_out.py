"""Scale-out: three `tokenpath collector` processes fed spans routed by trace id (as the
loadbalancing exporter routes them) expose metrics that sum to one collector's on the same
input."""

from __future__ import annotations

import random
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from prometheus_client.parser import text_string_to_metric_families

from tests.dashboards.otlp_workload import CollectorProcess, export_spans, request_trace
from tests.deploy.hash_ring import HashRing
from tokenpath import metric_names as mn
from tokenpath.stages import STAGES

pytestmark = pytest.mark.integration

TRACES = 90
SHARDS = 3
MODELS = ("model-a", "model-b")
START_UNIX_NANO = 1_700_000_000_000_000_000
SETTLE_TIMEOUT_SECONDS = 60.0
REQUEST_METRIC_NAMES = {spec.name for spec in mn.COLLECTOR_METRICS}


def _request_samples(http_url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"{http_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in REQUEST_METRIC_NAMES:
            continue
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def _requests_seen(http_url: str) -> float:
    return sum(v for (name, _), v in _request_samples(http_url).items()
               if name == mn.REQUESTS.series)


@pytest.fixture
def collectors(tmp_path: Path) -> Iterator[list[CollectorProcess]]:
    processes = [CollectorProcess(tmp_path, f"collector-{i}") for i in range(SHARDS + 1)]
    try:
        for process in processes:
            process.wait_ready()
        yield processes
    finally:
        for process in processes:
            process.stop()


def test_three_sharded_collectors_sum_to_one(collectors: list[CollectorProcess]) -> None:
    single, shards = collectors[0], collectors[1:]
    ring = HashRing([f"collector-{i}:4317" for i in range(len(shards))])
    endpoint_index = {f"collector-{i}:4317": i for i in range(len(shards))}
    rng = random.Random(7)
    routed: dict[int, list[Span]] = defaultdict(list)
    everything: list[Span] = []
    for index in range(TRACES):
        trace_id, spans = request_trace(rng, MODELS[index % len(MODELS)],
                                        START_UNIX_NANO + index * 10_000_000)
        routed[endpoint_index[ring.endpoint_for(trace_id)]].extend(spans)
        everything.extend(spans)
    assert len(routed) == len(shards) and all(routed.values())
    export_spans(single.http_url, everything)
    for index, spans in routed.items():
        export_spans(shards[index].http_url, spans)

    deadline = time.monotonic() + SETTLE_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if (_requests_seen(single.http_url) == TRACES
                and sum(_requests_seen(s.http_url) for s in shards) == TRACES):
            break
        time.sleep(0.2)
    expected = _request_samples(single.http_url)
    assert sum(v for (n, _), v in expected.items() if n == mn.REQUESTS.series) == TRACES
    summed: dict[tuple[str, tuple[tuple[str, str], ...]], float] = defaultdict(float)
    for shard in shards:
        for key, value in _request_samples(shard.http_url).items():
            summed[key] += value
    assert set(summed) == set(expected)
    for key, value in expected.items():
        assert summed[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    stage_series = mn.STAGE_DURATION.series + mn.HISTOGRAM_COUNT_SUFFIX
    assert {dict(labels)[mn.LABEL_STAGE] for (name, labels) in expected
            if name == stage_series} == {stage.id.value for stage in STAGES}


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
