"""Dollar views in Chromium: records priced the way the cost attributor prices them.

The first test takes records assembled from real OTLP spans, prices them again with a simple
apportionment (GPU seconds x $/s shared by a batch, the naive figure unshared) and stores
them with an idle slice, then checks that the UI shows dollars by stage, modeled labels,
the miss waste and the naive-versus-apportioned comparison. The second checks that
unpriced records show dashes, never $0, and that a priced window without waste shows $0.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.collector.ui.conftest import ConsoleLog, screenshot, start_collector, wait_for_records
from tests.collector.ui.workload import send_workload
from tokenpath.records import IdleCost, RequestRecord
from tokenpath.stages import GPU_STAGES, STAGES, StageGroup

pytestmark = pytest.mark.integration

GPU_DOLLARS_PER_SECOND = 2 * 3.0 / 3600  # two GPUs at $3/h
TWO_HOURS = 7200.0
BATCH = 8  # the apportioned share of a step; naive attribution charges the whole step
HOST_DOLLARS_PER_SECOND = 0.05 / 3600


def _price(record: RequestRecord) -> RequestRecord:
    groups = {stage.id: stage.group for stage in STAGES}
    total = 0.0
    for stage_id, timing in record.stages.items():
        if stage_id in GPU_STAGES:
            rate = GPU_DOLLARS_PER_SECOND / BATCH
            for share in timing.phases.values():
                share.cost_dollars = share.seconds * rate
        elif groups[stage_id] is StageGroup.NETWORK:
            rate = HOST_DOLLARS_PER_SECOND * 4
        else:
            rate = HOST_DOLLARS_PER_SECOND
        timing.cost_dollars = timing.seconds * rate
        total += timing.cost_dollars
    record.cost_dollars = total
    record.naive_cost_dollars = record.duration_seconds * GPU_DOLLARS_PER_SECOND
    prefill_tokens = max(1, record.input_tokens - record.cache_read_tokens)
    if record.cache_read_tokens == 0 and record.input_tokens > 2000:
        kernel = sum(t.cost_dollars for s, t in record.stages.items() if s in GPU_STAGES)
        record.cache_miss_waste_dollars = kernel * min(1.0, 1000 / prefill_tokens)
    return record


def _records_from_spans(requests: int, seed: int) -> list[dict[str, Any]]:
    """Request records a collector assembled from a workload's real OTLP spans."""
    source = start_collector()
    try:
        send_workload(source.http_url, requests, seed=seed)
        return wait_for_records(source.http_url, requests)
    finally:
        source.shutdown()


def test_priced_records_show_dollars(page: tuple[Any, ConsoleLog]) -> None:
    browser_page, console = page
    raw = _records_from_spans(24, seed=21)

    service = start_collector()
    try:
        records = [_price(RequestRecord.from_json(r)) for r in raw]
        old = records[0]
        old.start_unix -= TWO_HOURS
        old.end_unix -= TWO_HOURS
        for record in records:
            service.store.consume_record(record)
        newest = max(r.end_unix for r in records)
        service.store.consume_idle_cost(IdleCost("pool-a", newest - 60, newest, 0.05))
        service.store.flush()
        url = service.http_url

        browser_page.goto(f"{url}/#/")
        browser_page.wait_for_selector("main[data-ready='true']")
        # The default window (1 h) leaves out the record from two hours ago; "all" has it.
        assert browser_page.text_content(".lede").startswith(f"{len(records) - 1} requests")
        browser_page.select_option("#window-select", "all")
        browser_page.wait_for_function(
            f"document.querySelector('.lede').textContent.startsWith('{len(records)} requests')")
        browser_page.select_option("#window-select", "1h")
        browser_page.wait_for_function(
            f"document.querySelector('.lede').textContent.startsWith('{len(records) - 1} req')")
        cost_text = browser_page.text_content("#kpi-cost .kpi-value")
        assert cost_text is not None and cost_text.startswith("$")
        assert browser_page.text_content("#kpi-idle .kpi-value") == "$0.0500"
        assert "wasted on recomputed prefixes" in browser_page.text_content("#leak-cache")
        dollar_chart = browser_page.locator("svg[aria-label='Dollars by stage, in path order']")
        assert "modeled" in dollar_chart.text_content()
        screenshot(browser_page, "overview-priced")

        priciest = max(records, key=lambda r: r.naive_cost_dollars / max(r.cost_dollars, 1e-12))
        browser_page.goto(f"{url}/#/requests/{priciest.trace_id}")
        browser_page.wait_for_selector("table.waterfall")
        naive = browser_page.text_content("#kpi-naive .kpi-sub") or ""
        ratio = priciest.naive_cost_dollars / priciest.cost_dollars
        assert f"{ratio:.1f}\N{MULTIPLICATION SIGN} the apportioned cost" in naive
        screenshot(browser_page, "request-waterfall-priced")

        # What-if over priced records: busier GPUs lower the unit cost.
        browser_page.goto(f"{url}/#/whatif")
        browser_page.wait_for_selector("main[data-ready='true'][data-route='#/whatif']")
        browser_page.fill("#wi-cache", "0")
        browser_page.fill("#wi-util", "80")  # percent
        browser_page.click("#wi-submit")
        browser_page.wait_for_selector("#whatif-result .whatif-table")
        row = browser_page.locator(
            "#whatif-result tr[data-metric='cost_per_million_output_tokens']")
        baseline = float((row.locator(".baseline").text_content() or "").lstrip("$"))
        projected = float((row.locator(".projected").text_content() or "").lstrip("$"))
        assert projected < baseline
        screenshot(browser_page, "whatif-priced")
        assert console.errors == []
    finally:
        service.shutdown()


def _unpriced(record: RequestRecord) -> RequestRecord:
    record.cost_dollars = record.naive_cost_dollars = record.cache_miss_waste_dollars = 0.0
    for timing in record.stages.values():
        timing.cost_dollars = 0.0
        for share in timing.phases.values():
            share.cost_dollars = 0.0
    return record


def test_unpriced_records_show_dashes_and_priced_ones_show_zero_waste_as_dollars(
        page: tuple[Any, ConsoleLog]) -> None:
    browser_page, console = page
    raw = _records_from_spans(8, seed=5)
    dash = "\N{EM DASH}"

    unpriced = start_collector()
    try:
        records = [_unpriced(RequestRecord.from_json(r)) for r in raw]
        for record in records:
            unpriced.store.consume_record(record)
        unpriced.store.flush()
        browser_page.goto(f"{unpriced.http_url}/#/requests/{records[0].trace_id}")
        browser_page.wait_for_selector("table.waterfall")
        assert browser_page.text_content("#kpi-cost .kpi-value") == dash
        assert browser_page.text_content("#kpi-naive .kpi-value") == dash
        dollars = browser_page.locator("table.waterfall tr.stage-row td:nth-child(5)")
        assert dollars.count() > 0 and set(dollars.all_text_contents()) == {dash}
        assert "$" not in (browser_page.text_content("table.waterfall") or "")
        browser_page.goto(f"{unpriced.http_url}/#/")
        browser_page.wait_for_selector("main[data-ready='true']")
        assert "not priced yet" in (browser_page.text_content("#leak-cache") or "")
    finally:
        unpriced.shutdown()

    priced = start_collector()
    try:
        for record in raw:  # priced by the collector that received them; no miss waste
            stored = RequestRecord.from_json(record)
            stored.cache_miss_waste_dollars = 0.0
            priced.store.consume_record(stored)
        priced.store.flush()
        browser_page.goto(f"{priced.http_url}/#/")
        browser_page.wait_for_selector("main[data-ready='true']")
        leak = browser_page.text_content("#leak-cache") or ""
        assert "wasted on recomputed prefixes" in leak and "not priced" not in leak
        assert browser_page.text_content("#leak-cache .leak-value") == "$0"
        assert console.errors == []
    finally:
        priced.shutdown()
