"""tokenpath with the real GenAI packages in front of an instrumented serving path.

The serving side is the reference path (gateway + simulated engines) in this process,
exporting OTLP to a ``tokenpath collector`` subprocess under its default configuration.
The clients are the real packages, run from their own venv (scripts/genai_env.sh):

- the openai client under opentelemetry-instrumentation-openai-v2;
- an agent under traceloop-sdk: a ``@workflow`` of three calls with a tool step;
- litellm's proxy with its ``otel`` callback, between a client and the gateway.

None of them forwards ``traceparent`` to the server (the openai client's httpx2 transport
is not instrumented; LiteLLM does not forward it by default), so each call is two traces,
which the collector must turn into one record per call: the counts and tokens each call
had, its client or proxy stages, and the TTFT the user saw.

Installs the packages into a cached venv on first use (about 80 s). Set
TOKENPATH_SKIP_GENAI=1 to skip on a machine that cannot install them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from prometheus_client.parser import text_string_to_metric_families

from testkit.support.processes import free_port, stop_process
from tokenpath import metric_names as mn
from tokenpath.instrumentation.reference.serving_path import (
    ReferencePathConfig,
    ReferenceServingPath,
)
from tokenpath.stages import StageId

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

if os.environ.get("TOKENPATH_SKIP_GENAI") == "1":
    pytest.skip("TOKENPATH_SKIP_GENAI=1", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
CLIENTS = Path(__file__).resolve().parent / "genai_clients"
START_SECONDS = 60.0
RECORDS_SECONDS = 60.0
MASTER_KEY = "sk-tokenpath-integration-0123456789"


@dataclass
class Stack:
    genai_python: str
    collector_url: str
    serving_url: str
    work: Path


def _wait(what: str, seconds: float, check: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        try:
            value = check()
        except (httpx.HTTPError, AssertionError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {seconds} s")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("genai")
    env = subprocess.run(["bash", str(REPO / "scripts" / "genai_env.sh")], check=True,
                         capture_output=True, text=True, timeout=900)
    genai_python = env.stdout.strip().splitlines()[-1]
    port = free_port()
    # Every serving record waits for its client or proxy half (join mode always): in auto
    # mode a serving record that reaches the joiner before the first client half of the
    # run goes on alone, and how many do depends on the machine's timing.
    config = work / "collector.yml"
    config.write_text("join:\n  mode: always\n  wait_seconds: 30s\n", encoding="utf-8")
    collector = subprocess.Popen(
        [sys.executable, "-m", "tokenpath.cli.main", "collector", "--grpc", "off",
         "--http", f"127.0.0.1:{port}", "--store", str(work / "store.db"),
         "--config", str(config)],
        stdout=(work / "collector.log").open("wb"), stderr=subprocess.STDOUT)
    collector_url = f"http://127.0.0.1:{port}"
    provider = TracerProvider(resource=Resource.create({"service.name": "gateway"}))
    provider.add_span_processor(BatchSpanProcessor(
        OTLPSpanExporter(endpoint=f"{collector_url}/v1/traces"), schedule_delay_millis=200))
    serving = ReferenceServingPath(ReferencePathConfig(replicas=1), tracer_provider=provider)
    try:
        _wait("collector up", START_SECONDS,
              lambda: httpx.get(f"{collector_url}/healthz").status_code == 200)
        serving.start()
        yield Stack(genai_python, collector_url, serving.base_url, work)
    finally:
        serving.shutdown()
        provider.shutdown()
        stop_process(collector)


def _records(stack: Stack) -> list[dict[str, Any]]:
    response = httpx.get(f"{stack.collector_url}/api/requests", params={"limit": 1000})
    response.raise_for_status()
    records: list[dict[str, Any]] = response.json()
    return records


def _joined(stack: Stack) -> dict[str, float]:
    text = httpx.get(f"{stack.collector_url}/metrics").text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == mn.CALLS_JOINED.name:
            for sample in family.samples:
                out[sample.labels[mn.LABEL_OUTCOME]] = sample.value
    return out


def _records_for(stack: Stack, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Waits until each call's record is in the store, then returns them in call order.
    A call's record is the one that names its response id."""
    ids = [c["id"] for c in calls]

    def ready() -> list[dict[str, Any]] | None:
        by_id: dict[str, list[dict[str, Any]]] = {}
        for record in _records(stack):
            by_id.setdefault(record["response_id"], []).append(record)
        if not all(i in by_id for i in ids):
            return None
        assert all(len(by_id[i]) == 1 for i in ids), "one record per call"
        return [by_id[i][0] for i in ids]

    found: list[dict[str, Any]] = _wait("a record per call", RECORDS_SECONDS, ready)
    return found


def _run_client(stack: Stack, script: str, *args: str) -> list[dict[str, Any]]:
    done = subprocess.run([stack.genai_python, str(CLIENTS / script), stack.serving_url,
                           stack.collector_url, *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _assert_one_record_per_call(stack: Stack, calls: list[dict[str, Any]],
                                before: dict[str, float]) -> list[dict[str, Any]]:
    records = _records_for(stack, calls)
    for call, record in zip(calls, records, strict=True):
        assert (record["input_tokens"], record["output_tokens"]) == (
            call["prompt_tokens"], call["completion_tokens"])
        assert record["outer_hop"] is None  # the serving side's record, not the client's
        assert record["engine"] is not None
    # no client half went on as a request of its own
    assert _joined(stack).get("alone", 0) == before.get("alone", 0)
    assert not [r for r in _records(stack) if r["outer_hop"] is not None]
    return records


def _wait_joined(stack: Stack, before: dict[str, float], n: int) -> None:
    """Every client half traced apart was joined, or counted late (its call was already
    counted): none is a request of its own."""
    def accounted() -> bool:
        now = _joined(stack)
        return sum(now.get(k, 0) - before.get(k, 0) for k in ("joined", "late")) >= n
    _wait("every client half accounted for", RECORDS_SECONDS, accounted)


def _with_client_stages(stack: Stack, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The calls' records once each carries the client's stages: the client's spans come
    in an export of their own, which may reach the collector after the record of the
    serving side's spans was first stored."""
    client_stages = (StageId.CLIENT_TOKENIZE.value, StageId.CLIENT_DECODE.value)

    def ready() -> list[dict[str, Any]] | None:
        records = _records_for(stack, calls)
        return records if all(s in r["stages"] for r in records for s in client_stages) \
            else None

    found: list[dict[str, Any]] = _wait("the client's stages in every call's record",
                                        RECORDS_SECONDS, ready)
    return found


def _assert_client_stages(record: dict[str, Any]) -> None:
    stages = record["stages"]
    for stage in (StageId.CLIENT_TOKENIZE, StageId.CLIENT_DECODE):
        assert stage.value in stages, stages.keys()
        assert stages[stage.value]["provenance"] == "derived"
        assert stages[stage.value]["seconds"] >= 0
    assert record["start_unix"] < record["engine_start_unix"]


def test_openai_v2_client_calls_are_one_record_each_with_client_stages(stack: Stack) -> None:
    before = _joined(stack)
    calls = _run_client(stack, "openai_v2_calls.py", "4")
    assert len(calls) == 4
    records = _assert_one_record_per_call(stack, calls, before)
    _wait_joined(stack, before, len(calls))
    records = _records_for(stack, calls)
    joined = [r for r in records if r["joined_trace_ids"]]
    assert len(joined) == len(calls)  # every serving record waited for its client half
    for record in joined:
        _assert_client_stages(record)
        assert record["ttft_seconds"] is not None
        assert 0 < record["ttft_seconds"] <= record["duration_seconds"]


def test_a_traceloop_workflow_of_three_calls_is_three_records(stack: Stack) -> None:
    before = _joined(stack)
    lines = _run_client(stack, "traceloop_workflow.py")
    calls, workflow = lines[:-1], lines[-1]["workflow_trace_id"]
    assert len(calls) == 3
    _assert_one_record_per_call(stack, calls, before)
    records = _with_client_stages(stack, calls)
    # each call its own tokens (one record of the workflow had only the first call's)
    assert sum(r["output_tokens"] for r in records) == sum(
        c["completion_tokens"] for c in calls)
    assert len({r["record_id"] for r in records}) == 3
    for record in records:  # traceloop's openai instrumentation propagates the trace
        _assert_client_stages(record)
        assert record["trace_id"] == workflow or workflow in record["joined_trace_ids"]
    streamed = records[1]
    # the client's first chunk (OpenLLMetry's chunk event), inside the call as it saw it
    assert 0 < streamed["ttft_seconds"] < streamed["duration_seconds"]
    view = httpx.get(f"{stack.collector_url}/api/traces/{workflow}")
    assert view.status_code == 200
    assert [r["record_id"] for r in view.json()] == [r["record_id"] for r in records]


@pytest.fixture(scope="module")
def litellm_url(stack: Stack) -> Iterator[str]:
    port = free_port()
    config = stack.work / "litellm.yaml"
    config.write_text(json.dumps({
        "model_list": [{"model_name": "m", "litellm_params": {
            "model": "openai/m", "api_base": f"{stack.serving_url}/v1", "api_key": "unused"}}],
        "litellm_settings": {"callbacks": ["otel"]},
    }))
    litellm = str(Path(stack.genai_python).parent / "litellm")
    proxy = subprocess.Popen(
        [litellm, "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
        stdout=(stack.work / "litellm.log").open("wb"), stderr=subprocess.STDOUT,
        env={**os.environ, "LITELLM_MASTER_KEY": MASTER_KEY,
             "LITELLM_LOCAL_MODEL_COST_MAP": "True", "OTEL_EXPORTER": "otlp_http",
             "OTEL_ENDPOINT": f"{stack.collector_url}/v1/traces",
             "OTEL_SERVICE_NAME": "litellm-proxy"})
    url = f"http://127.0.0.1:{port}"
    try:
        _wait("litellm proxy up", 120.0, lambda: proxy.poll() is None and httpx.get(
            f"{url}/health/liveliness").status_code == 200)
        yield url
    finally:
        stop_process(proxy)


def test_calls_through_litellm_are_one_record_each_with_its_stages(
        stack: Stack, litellm_url: str) -> None:
    before = _joined(stack)
    calls = []
    headers = {"Authorization": f"Bearer {MASTER_KEY}"}
    with httpx.Client(base_url=litellm_url, headers=headers, timeout=60) as client:
        for i in range(3):
            body = {"model": "m", "max_tokens": 6 + i,
                    "messages": [{"role": "user", "content": f"Route question {i}"}]}
            response = client.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            payload = response.json()
            calls.append({"id": payload["id"],
                          "prompt_tokens": payload["usage"]["prompt_tokens"],
                          "completion_tokens": payload["usage"]["completion_tokens"]})
    records = _assert_one_record_per_call(stack, calls, before)
    _wait_joined(stack, before, len(calls))
    records = _records_for(stack, calls)
    for record in records:
        stages = record["stages"]
        assert record["joined_trace_ids"], "the proxy's trace is joined to the record"
        assert StageId.ROUTER.value in stages and StageId.AUTH_RATELIMIT.value in stages
        # the proxy's upstream wait is not gateway time: the gateway hops and the engine
        # fit inside the call
        engine = record["engine_end_unix"] - record["engine_start_unix"]
        gateway = sum(stages[s.value]["seconds"] for s in (
            StageId.API_GATEWAY, StageId.AUTH_RATELIMIT, StageId.ROUTER))
        assert gateway + engine <= record["duration_seconds"] + 1e-3
