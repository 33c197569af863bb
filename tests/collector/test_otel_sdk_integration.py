"""The real OpenTelemetry SDK and OTLP exporters against `tokenpath collector` as a
subprocess: what goes in comes out in /metrics and `tokenpath requests`."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from prometheus_client.parser import text_string_to_metric_families

from testkit.support.processes import collector_process, poll_records, run_cli_json
from tokenpath import attributes as A
from tokenpath import metric_names as M
from tokenpath.stages import StageId

pytestmark = pytest.mark.integration

MODEL = "llama-3.1-8b"
EVENT_STAGES = (StageId.SCHEDULER_QUEUE, StageId.KV_CACHE_LOOKUP, StageId.GPU_DISPATCH)


def _send_requests(exporter: SpanExporter, count: int, seed: int) -> list[dict[str, Any]]:
    """Emit `count` requests: a root span, a router child span, engine stage events."""
    rng = random.Random(seed)
    provider = TracerProvider(resource=Resource.create({A.NODE: "node-a", A.POOL: "pool-a"}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracer = provider.get_tracer("tokenpath-test")
    sent = []
    for _ in range(count):
        truth: dict[str, Any] = {
            "input": rng.randint(50, 500),
            "output": rng.randint(5, 50),
            "ttft": round(rng.uniform(0.05, 0.5), 4),
            "events": {stage: round(rng.uniform(0.0005, 0.02), 5) for stage in EVENT_STAGES},
        }
        truth["cached"] = rng.randint(0, truth["input"])
        with tracer.start_as_current_span("gateway request") as root:
            root.set_attribute(A.GEN_AI_REQUEST_MODEL, MODEL)
            root.set_attribute(A.GEN_AI_USAGE_INPUT_TOKENS, truth["input"])
            root.set_attribute(A.GEN_AI_USAGE_OUTPUT_TOKENS, truth["output"])
            root.set_attribute(A.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, truth["cached"])
            root.set_attribute(A.TTFT_SECONDS, truth["ttft"])
            with tracer.start_as_current_span("router") as child:
                child.set_attribute(A.STAGE, StageId.ROUTER.value)
            for stage, seconds in truth["events"].items():
                root.add_event(A.STAGE_EVENT, {A.STAGE: stage.value, A.STAGE_SECONDS: seconds})
            truth["trace_id"] = format(root.get_span_context().trace_id, "032x")
        sent.append(truth)
    assert provider.force_flush(10_000)
    provider.shutdown()
    return sent


def _metric_samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_sdk_exporters_round_trip(tmp_path: Path, transport: str) -> None:
    with collector_process(tmp_path / "store.db") as collector:
        exporter: SpanExporter
        if transport == "grpc":
            exporter = GrpcExporter(endpoint=collector.grpc_endpoint, insecure=True)
        else:
            exporter = HttpExporter(endpoint=f"{collector.http_url}/v1/traces")
        sent = _send_requests(exporter, count=12, seed=7)
        records = poll_records(collector.http_url, len(sent))
        samples = _metric_samples(collector.http_url)
        cli_records = run_cli_json("requests", "--collector", collector.http_url,
                                   "--limit", "100")

    by_trace = {r["trace_id"]: r for r in cli_records}
    assert len(records) == len(sent) == len(by_trace)
    for truth in sent:
        record = by_trace[truth["trace_id"]]
        assert record["model"] == MODEL
        assert record["input_tokens"] == truth["input"]
        assert record["output_tokens"] == truth["output"]
        assert record["cache_read_tokens"] == truth["cached"]
        assert record["ttft_seconds"] == pytest.approx(truth["ttft"])
        assert record["complete"] is True
        assert record["node"] == "node-a"
        for stage, seconds in truth["events"].items():
            assert record["stages"][stage.value]["seconds"] == pytest.approx(seconds)
            assert record["stages"][stage.value]["provenance"] == "measured"
        assert StageId.ROUTER.value in record["stages"]

    model = (("model", MODEL),)
    assert samples[(M.TTFT.name + "_count", model)] == len(sent)
    assert samples[(M.TTFT.name + "_sum", model)] == pytest.approx(sum(t["ttft"] for t in sent))
    for kind, key in ((M.TOKEN_KIND_INPUT, "input"), (M.TOKEN_KIND_OUTPUT, "output"),
                      (M.TOKEN_KIND_CACHE_READ, "cached")):
        labels = tuple(sorted({"model": MODEL, "kind": kind}.items()))
        assert samples[(M.TOKENS.series, labels)] == sum(t[key] for t in sent)
    for stage in EVENT_STAGES:
        labels = tuple(sorted({"model": MODEL, "stage": stage.value}.items()))
        assert samples[(M.STAGE_DURATION.name + "_count", labels)] == len(sent)
        assert samples[(M.STAGE_DURATION.name + "_sum", labels)] == pytest.approx(
            sum(t["events"][stage] for t in sent))
    ok = tuple(sorted({"model": MODEL, "status": "ok"}.items()))
    assert samples[(M.REQUESTS.series, ok)] == len(sent)


def test_records_survive_restart(tmp_path: Path) -> None:
    store = tmp_path / "store.db"
    with collector_process(store) as collector:
        sent = _send_requests(HttpExporter(endpoint=f"{collector.http_url}/v1/traces"), 5, 3)
        poll_records(collector.http_url, len(sent))
    # A fresh process on the same store, and the CLI reading the file directly.
    with collector_process(store) as collector:
        again = httpx.get(f"{collector.http_url}/api/requests", timeout=5).json()
    from_file = run_cli_json("requests", "--store", str(store))
    expected = {t["trace_id"] for t in sent}
    assert {r["trace_id"] for r in again} == expected
    assert {r["trace_id"] for r in from_file} == expected


def test_clean_shutdown_flushes_buffered_traces(tmp_path: Path) -> None:
    """Spans still in the assembler when SIGTERM arrives are written before exit."""
    store = tmp_path / "store.db"
    with collector_process(store, "--config", str(_slow_config(tmp_path))) as collector:
        sent = _send_requests(HttpExporter(endpoint=f"{collector.http_url}/v1/traces"), 4, 5)
        # The long grace period keeps them buffered: none is recorded yet.
        assert httpx.get(f"{collector.http_url}/api/requests", timeout=5).json() == []
    records = run_cli_json("requests", "--store", str(store))
    assert {r["trace_id"] for r in records} == {t["trace_id"] for t in sent}


def _slow_config(tmp_path: Path) -> Path:
    path = tmp_path / "collector.yaml"
    path.write_text("assembler:\n  root_grace_seconds: 600\n  idle_timeout_seconds: 600\n")
    return path
