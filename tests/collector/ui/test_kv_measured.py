"""Measured causes beside the inferred ones: engines' KV-cache events -> a real node agent
-> its OTLP push -> a real collector -> /api/leaks and the Cache & leaks page."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from testkit.fakes.fake_nvml import FakeNvml
from testkit.fakes.kv_events import KvPublisher, block_hash, vllm_batch, vllm_removed, vllm_stored
from testkit.support.processes import free_port
from tests.collector.ui.conftest import ConsoleLog, screenshot
from tokenpath.agent.config import AgentConfig
from tokenpath.agent.kv_index import CAUSE_COLD, CAUSE_EVICTED
from tokenpath.agent.service import AgentService
from tokenpath.collector.service import CollectorService

WAIT_SECONDS = 20.0
ENGINE = "vllm-0"
MODEL = "m"
BLOCK = 32
RESEND_AFTER_SECONDS = 3.0


@pytest.fixture
def agent(collector: CollectorService) -> Iterator[tuple[AgentService, str]]:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    config = AgentConfig(listen="127.0.0.1:0", node="gpu-node-1", interval_seconds=0.05,
                         push_interval_seconds=0.05, collector_url=collector.http_url,
                         kv_events=(f"{ENGINE}={endpoint}",), kv_event_models={ENGINE: MODEL})
    service = AgentService(config, nvml=FakeNvml([]))
    service.start(serve=False)
    try:
        yield service, endpoint
    finally:
        service.shutdown()


def _measured(url: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = httpx.get(f"{url}/api/leaks", timeout=5).json()["cache"][
        "measured"]
    return rows


def _publish_evictions(endpoint: str, agent: AgentService) -> None:
    """Three blocks stored, one removed and stored again: 3 cold, 1 evicted."""
    publisher = KvPublisher(endpoint, "ignored-topic")
    tracker = agent.kv_tracker
    assert tracker is not None
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        while tracker.resident_blocks() < 3:  # PUB drops until connected: resend
            assert time.monotonic() < deadline
            publisher.seq = 0
            publisher.publish(vllm_batch(1.0, [vllm_stored([block_hash(n) for n in range(3)])]))
            # a resend that arrives too is a restart to the agent (its sequence starts
            # again) and counts the blocks cold twice: resend only once this one is lost
            applied_by = time.monotonic() + RESEND_AFTER_SECONDS
            while tracker.resident_blocks() < 3 and time.monotonic() < applied_by:
                time.sleep(0.02)
        publisher.publish(vllm_batch(2.0, [vllm_removed([block_hash(0)])]))
        publisher.publish(vllm_batch(3.0, [vllm_stored([block_hash(0)])]))
    finally:
        publisher.close()


def _tokens(rows: list[dict[str, Any]]) -> dict[str, float]:
    return {row["cause"]: row["tokens"] for row in rows if row["engine"] == ENGINE}


def _wait_measured(url: str) -> list[dict[str, Any]]:
    deadline = time.monotonic() + WAIT_SECONDS
    rows = _measured(url)
    while _tokens(rows).get(CAUSE_EVICTED) != BLOCK:
        assert time.monotonic() < deadline, rows
        time.sleep(0.05)
        rows = _measured(url)
    return rows


def test_the_leaks_view_carries_the_agents_measured_causes(
        collector: CollectorService, agent: tuple[AgentService, str]) -> None:
    assert _measured(collector.http_url) == []  # no agent has pushed KV counters yet
    service, endpoint = agent
    _publish_evictions(endpoint, service)
    rows = _wait_measured(collector.http_url)
    assert _tokens(rows) == {CAUSE_COLD: 3 * BLOCK, CAUSE_EVICTED: BLOCK, "routed": 0}
    assert {(row["node"], row["model"]) for row in rows} == {("gpu-node-1", MODEL)}


def test_the_cache_page_shows_measured_causes_beside_the_inferred(
        collector: CollectorService, agent: tuple[AgentService, str],
        page: tuple[Any, ConsoleLog]) -> None:
    browser_page, console = page
    url = collector.http_url
    browser_page.goto(f"{url}/#/leaks")
    browser_page.wait_for_selector("[data-route='#/leaks']")
    assert "no node agent sends the engines' KV-cache events" in browser_page.text_content(
        "body")
    service, endpoint = agent
    _publish_evictions(endpoint, service)
    _wait_measured(url)
    # the view polls: wait for the table rather than reloading on a timer
    browser_page.wait_for_selector(".measured-causes-table", timeout=15_000)
    evicted = browser_page.locator(".measured-causes-table tr[data-cause='evicted'] td")
    assert evicted.nth(1).text_content() == ENGINE
    assert evicted.nth(4).text_content() == "32"
    agreement = browser_page.text_content("#causes-agreement") or ""
    assert "measured cold 75%, evicted 25%, routed 0%; inferred" in agreement, agreement
    screenshot(browser_page, "leaks-measured-causes")
    assert console.errors == []
