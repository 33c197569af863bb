"""Fixtures for the UI tests: a real in-process collector and real headless Chromium.

Chromium is Debian's (``/usr/bin/chromium``, installed by ``make test`` through
scripts/install-system-deps.sh), driven by Playwright for Python; ``playwright install``
is never run. Without either, the browser tests skip and say why.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tokenpath.collector.assembler import AssemblerConfig
from tokenpath.collector.config import CollectorConfig
from tokenpath.collector.cost.attributor import AttributorConfig
from tokenpath.collector.service import CollectorService

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts" / "ui"
FAST_ASSEMBLY = AssemblerConfig(root_grace_seconds=0.1, idle_timeout_seconds=5.0)
# The workload's spans are back-dated over minutes; a short attribution delay prices them
# as they arrive instead of holding them for the (adaptive) arrival lag.
FAST_COST = AttributorConfig(min_delay_seconds=0.2, max_delay_seconds=0.5, tick_seconds=0.1)


def start_collector(auth_token: str | None = None) -> CollectorService:
    service = CollectorService(CollectorConfig(http_port=0, grpc_port=None, auth_token=auth_token,
                                               assembler=FAST_ASSEMBLY, cost=FAST_COST))
    service.start()
    return service


def wait_for_records(url: str, expected: int, headers: dict[str, str] | None = None,
                     timeout: float = 30.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    records: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        records = httpx.get(f"{url}/api/requests", params={"limit": 10_000},
                            headers=headers or {}, timeout=5).json()
        if len(records) >= expected:
            return records
        time.sleep(0.1)
    raise AssertionError(f"expected {expected} records, got {len(records)}")


@pytest.fixture
def collector() -> Iterator[CollectorService]:
    service = start_collector()
    try:
        yield service
    finally:
        service.shutdown()


# Package scope: the sync Playwright API keeps an event loop on the main thread while it
# runs, which would break asyncio.run in tests collected after these.
@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="playwright (dev extra) is not installed")
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        pytest.skip("Debian chromium is not installed (scripts/install-system-deps.sh)")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


class ConsoleLog:
    """Browser console errors and uncaught page errors seen by one page."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def on_console(self, message: Any) -> None:
        if message.type == "error":
            self.errors.append(f"console: {message.text}")

    def on_page_error(self, error: Any) -> None:
        self.errors.append(f"pageerror: {error}")


@pytest.fixture
def page(browser: Any) -> Iterator[tuple[Any, ConsoleLog]]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    new_page = context.new_page()
    log = ConsoleLog()
    new_page.on("console", log.on_console)
    new_page.on("pageerror", log.on_page_error)
    try:
        yield new_page, log
    finally:
        context.close()


def screenshot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
