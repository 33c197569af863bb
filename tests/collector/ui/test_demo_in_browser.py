"""The UI over a short real demo run: `tokenpath demo` writes its store, a collector serves
that store (as the demo's closing lines tell a user to do), and Chromium looks at it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.collector.ui.conftest import ConsoleLog, screenshot
from tokenpath.collector.config import CollectorConfig
from tokenpath.collector.service import CollectorService
from tokenpath.stages import STAGE_IDS

pytestmark = pytest.mark.integration

READY = "main[data-ready='true']"


def _open(page: Any, url: str, route: str) -> None:
    page.goto(f"{url}/#{route}")
    page.wait_for_selector(f"{READY}[data-route='#{route}'], #banner:not([hidden])")
    assert page.is_hidden("#banner"), page.text_content("#banner")


def test_ui_shows_a_short_demo(tmp_path: Path, page: tuple[Any, ConsoleLog]) -> None:
    store = tmp_path / "demo.db"
    demo = subprocess.run(
        [sys.executable, "-m", "tokenpath.cli.main", "demo", "--duration", "4", "--rps", "6",
         "--time-scale", "0.05", "--store", str(store), "--collector-http", "127.0.0.1:0",
         "--agent-listen", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=180, check=False)
    assert demo.returncode == 0, demo.stdout + demo.stderr

    service = CollectorService(CollectorConfig(http_port=0, grpc_port=None,
                                               store_path=str(store)))
    service.start()
    browser_page, console = page
    try:
        url = service.http_url
        summary = httpx.get(f"{url}/api/summary", timeout=10).json()
        assert summary["requests"] > 5 and summary["cost_dollars"] > 0

        _open(browser_page, url, "/")
        lede = browser_page.text_content(".lede")
        assert f"{summary['requests']} requests" in lede
        hit_ratio = browser_page.text_content("#kpi-hit-ratio .kpi-value")
        assert hit_ratio == f"{summary['prefix_cache_hit_ratio'] * 100:.1f}%"
        assert browser_page.text_content("#kpi-cost .kpi-value").startswith("$")
        screenshot(browser_page, "demo-overview")

        newest = httpx.get(f"{url}/api/requests", params={"limit": 1}, timeout=10).json()[0]
        _open(browser_page, url, f"/requests/{newest['trace_id']}")
        rows = browser_page.locator("table.waterfall tbody tr")
        assert [rows.nth(i).get_attribute("data-stage") for i in range(rows.count())] == [
            s.value for s in STAGE_IDS]
        screenshot(browser_page, "demo-request-waterfall")

        _open(browser_page, url, "/whatif")
        browser_page.fill("#wi-spec", "2")
        browser_page.click("#wi-submit")
        browser_page.wait_for_selector(".whatif-table")
        cost = browser_page.locator("tr[data-metric='cost_per_million_output_tokens']")
        assert float(cost.locator(".projected").text_content().lstrip("$").replace(",", "")) < \
            float(cost.locator(".baseline").text_content().lstrip("$").replace(",", ""))
        screenshot(browser_page, "demo-whatif")
        assert console.errors == []
    finally:
        service.shutdown()
