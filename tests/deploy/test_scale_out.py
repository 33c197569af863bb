"""Scale-out: three `tokenpath collector` processes fed spans routed by trace id (as the
loadbalancing exporter routes them) expose metrics that sum to one collector's on the same
input."""

from __future__ import annotations

import random
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from prometheus_client.parser import text_string_to_metric_families

from tests.dashboards.prometheus_stack import free_port
from tests.deploy.hash_ring import HashRing
from tokenpath import attributes as attr
from tokenpath import metric_names as mn
from tokenpath.stages import STAGES, Phase

pytestmark = pytest.mark.integration

TRACES = 90
SHARDS = 3
MODELS = ("model-a", "model-b")
READY_TIMEOUT_SECONDS = 60.0
SETTLE_TIMEOUT_SECONDS = 60.0
REQUEST_METRIC_NAMES = {spec.name for spec in mn.COLLECTOR_METRICS}


def _kv(key: str, value: object) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def _trace(rng: random.Random, index: int) -> tuple[bytes, list[Span]]:
    trace_id = rng.randbytes(16)
    start = 1_700_000_000_000_000_000 + index * 10_000_000
    input_tokens = rng.randint(100, 4000)
    root = Span(trace_id=trace_id, span_id=rng.randbytes(8), name=attr.SPAN_REQUEST,
                kind=Span.SPAN_KIND_SERVER, start_time_unix_nano=start,
                end_time_unix_nano=start + 900_000_000)
    root.attributes.extend([
        _kv(attr.GEN_AI_REQUEST_MODEL, MODELS[index % len(MODELS)]),
        _kv(attr.GEN_AI_USAGE_INPUT_TOKENS, input_tokens),
        _kv(attr.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, rng.randint(0, input_tokens)),
        _kv(attr.GEN_AI_USAGE_OUTPUT_TOKENS, rng.randint(1, 500)),
        _kv(attr.TTFT_SECONDS, rng.uniform(0.01, 2.0)),
        _kv(attr.RESPONSE_CHUNKS, 40), _kv(attr.RESPONSE_SMALL_CHUNKS, rng.randint(0, 40)),
    ])
    for stage in STAGES:
        event = root.events.add()
        event.name = attr.STAGE_EVENT
        event.time_unix_nano = start + stage.order * 1_000_000
        event.attributes.extend([_kv(attr.STAGE, stage.id.value),
                                 _kv(attr.STAGE_SECONDS, rng.uniform(1e-4, 0.2)),
                                 _kv(attr.PHASE, (Phase.PREFILL if stage.order % 2
                                                  else Phase.DECODE).value)])
    child = Span(trace_id=trace_id, span_id=rng.randbytes(8), parent_span_id=root.span_id,
                 name="engine step", start_time_unix_nano=start + 1_000_000,
                 end_time_unix_nano=start + 51_000_000)
    child.attributes.extend([_kv(attr.STAGE, STAGES[4].id.value)])
    return trace_id, [child, root]


def _export(http_url: str, spans: list[Span]) -> None:
    request = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        scope_spans=[ScopeSpans(spans=spans)])])
    post = urllib.request.Request(f"{http_url}/v1/traces", data=request.SerializeToString(),
                                  headers={"Content-Type": "application/x-protobuf"})
    with urllib.request.urlopen(post, timeout=10) as response:
        assert response.status == 200


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


class CollectorProcess:
    def __init__(self, workdir: Path, name: str) -> None:
        self.http_url = f"http://127.0.0.1:{free_port()}"
        config = workdir / f"{name}.yaml"
        config.write_text(yaml.safe_dump({"assembler": {"root_grace_seconds": 0.2,
                                                        "tick_seconds": 0.05}}), "utf-8")
        self.log = workdir / f"{name}.log"
        argv = [sys.executable, "-m", "tokenpath.cli.main", "collector", "--grpc", "off",
                "--http", self.http_url.removeprefix("http://"),
                "--store", str(workdir / f"{name}.db"), "--config", str(config)]
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text(errors="replace")
            try:
                with urllib.request.urlopen(f"{self.http_url}/healthz", timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"collector not ready: {self.log.read_text(errors='replace')}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)


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
        trace_id, spans = _trace(rng, index)
        routed[endpoint_index[ring.endpoint_for(trace_id)]].extend(spans)
        everything.extend(spans)
    assert len(routed) == len(shards) and all(routed.values())
    _export(single.http_url, everything)
    for index, spans in routed.items():
        _export(shards[index].http_url, spans)

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
