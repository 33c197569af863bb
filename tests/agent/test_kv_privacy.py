"""No token id, session or other content of a KV-cache event outlives its decoding: not in
the agent's memory, not on /metrics, not in what it pushes to the collector."""

from __future__ import annotations

import gc
import secrets
import time

import httpx

from testkit.fakes.fake_nvml import FakeNvml
from testkit.fakes.kv_events import (
    KvPublisher,
    block_hash,
    sglang_batch,
    sglang_stored,
    vllm_batch,
    vllm_stored,
)
from testkit.support.processes import free_port
from tests.agent.conftest import PageServer
from tokenpath import metric_names as mn
from tokenpath.agent.config import AgentConfig
from tokenpath.agent.service import AgentService

WAIT_SECONDS = 10.0
BLOCKS = 4


def _payloads(token: int, text: str) -> list[bytes]:
    """Batches whose every token id is ``token`` and whose session, LoRA name and extra
    keys are ``text``; only their bytes leave this function."""
    return [
        vllm_batch(1.0, [vllm_stored([block_hash(n) for n in range(BLOCKS)],
                                     token_ids=[token] * (32 * BLOCKS), session_id=text,
                                     extra_keys=[(text,)] * BLOCKS, ownership=text,
                                     lora_name=None)]),
        sglang_batch(2.0, [sglang_stored([100 + n for n in range(BLOCKS)],
                                         token_ids=[token] * (16 * BLOCKS))]),
    ]


def _containers_holding(value: object) -> list[object]:
    found = []
    for obj in gc.get_objects():
        try:
            if (isinstance(obj, list | tuple | set | frozenset) and value in obj) or (
                    isinstance(obj, dict) and (value in obj or value in obj.values())):
                found.append(obj)
        except TypeError:
            continue
    return found


def test_token_ids_and_sessions_never_outlive_decoding(page_server: PageServer) -> None:
    token = 2**40 + secrets.randbelow(2**20)  # no vocabulary has this id
    text = f"kv-marker-{secrets.token_hex(8)}"
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    config = AgentConfig(listen="127.0.0.1:0", node="node-a", interval_seconds=0.05,
                         push_interval_seconds=0.05, collector_url=page_server.base_url,
                         kv_events=(f"engine-a={endpoint}",))
    agent = AgentService(config, nvml=FakeNvml([]))
    agent.start()
    publisher = KvPublisher(endpoint, "engine-a")
    assert agent.kv_tracker is not None
    tracker = agent.kv_tracker
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        while tracker.resident_blocks() < 2 * BLOCKS:  # PUB drops until connected: resend
            assert time.monotonic() < deadline, "the batches never arrived"
            publisher.seq = 0
            for payload in _payloads(token, text):
                publisher.publish(payload)
            time.sleep(0.05)
        pushes = len(page_server.posts)
        while len(page_server.posts) < pushes + 2:
            assert time.monotonic() < deadline, "no push after the batches"
            time.sleep(0.05)
        page = httpx.get(f"{agent.metrics_url}", timeout=10).text
        publisher.sent.clear()
        gc.collect()
        assert _containers_holding(token) == []
        assert _containers_holding(text) == []
    finally:
        publisher.close()
        agent.shutdown()
    assert mn.KV_STORED_BLOCKS.series in page
    for needle in (str(token), text):
        assert needle not in page
        for _, _, body in page_server.posts:
            assert needle.encode() not in body
            assert token.to_bytes(8, "big") not in body
