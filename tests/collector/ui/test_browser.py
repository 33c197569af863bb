"""The built-in UI in real headless Chromium against a real collector fed over OTLP."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.collector.ui.conftest import ConsoleLog, screenshot, start_collector, wait_for_records
from tests.collector.ui.workload import send_workload
from tokenpath import attributes as A
from tokenpath import metric_names as M
from tokenpath.collector.receivers.otlp_decode import MetricPoint
from tokenpath.collector.service import CollectorService
from tokenpath.stages import STAGE_IDS, STAGES, StageId

pytestmark = pytest.mark.integration

WORKLOAD_REQUESTS = 30
READY = "main[data-ready='true']"
PageAndLog = tuple[Any, ConsoleLog]


def _open(page: Any, url: str, route: str) -> None:
    """Go to a view and wait until it rendered; a view that failed shows its error banner."""
    page.goto(f"{url}/#{route}")
    page.wait_for_selector(f"{READY}[data-route='#{route}'], #banner:not([hidden])")
    assert page.is_hidden("#banner"), page.text_content("#banner")


def test_views_render_workload_in_chromium(collector: CollectorService,
                                           page: PageAndLog) -> None:
    browser_page, console = page
    url = collector.http_url
    sent = send_workload(url, WORKLOAD_REQUESTS)
    wait_for_records(url, WORKLOAD_REQUESTS)
    summary = httpx.get(f"{url}/api/summary", timeout=5).json()

    # Overview: figures from the API, the three leaks, the per-stage charts.
    _open(browser_page, url, "/")
    hit_ratio = browser_page.text_content("#kpi-hit-ratio .kpi-value")
    assert hit_ratio == f"{summary['prefix_cache_hit_ratio'] * 100:.1f}%"
    assert f"{WORKLOAD_REQUESTS} requests" in browser_page.text_content(".lede")
    # it says whose records these are (a replica shows those it priced)
    assert "records priced by this collector" in browser_page.text_content(".lede")
    # The workload's TTFTs are 10 ms to 1 s, which the page shows as "12.3 ms".
    ttft = browser_page.text_content("#kpi-ttft .kpi-value")
    assert ttft == f"{summary['ttft_p50_seconds'] * 1000:.1f} ms"
    assert f"p95 {summary['ttft_p95_seconds'] * 1000:.1f} ms" in browser_page.text_content(
        "#kpi-ttft .kpi-sub")
    for leak in ("#leak-cache", "#leak-long-context", "#leak-small-packets"):
        assert browser_page.is_visible(leak)
    # energy, labelled as the API labels it (modeled here: no NVML)
    assert summary["energy_provenance"] == "modeled"
    assert "GPU energy (modeled)" in browser_page.text_content("#kpi-energy")
    # the chargeback table: the API's tenants, in its order
    charge = httpx.get(f"{url}/api/chargeback").json()
    tenants = browser_page.locator(".tenants-table tbody tr")
    assert [tenants.nth(i).get_attribute("data-tenant") for i in range(tenants.count())] == [
        row["tenant"] for row in charge["rows"]]
    # attributed dollars are settled; idle keeps growing while the collector runs
    assert sum(r["cost_dollars"] for r in charge["rows"]) == pytest.approx(
        summary["cost_dollars"])
    assert charge["total_dollars"] == pytest.approx(
        sum(r["total_dollars"] for r in charge["rows"]))
    latency = browser_page.locator("svg[aria-label='p50 seconds by stage, in path order']")
    labels = latency.locator("text.axis-label").all_text_contents()
    assert labels == [f"{s.order}. {s.title}" for s in STAGES]
    # The collector's cost attributor priced the records: the page shows the API's figure.
    cost = browser_page.text_content("#kpi-cost .kpi-value")
    assert summary["cost_dollars"] > 0
    assert cost == f"${summary['cost_dollars']:.4f}" or cost == f"${summary['cost_dollars']:.2f}"
    assert "naive wall-clock" in browser_page.text_content("#kpi-cost .kpi-sub")
    screenshot(browser_page, "overview")

    # Requests list -> one request's waterfall: all 15 stages, in the server's path order.
    _open(browser_page, url, "/requests")
    assert browser_page.locator(".requests-table tbody tr").count() == WORKLOAD_REQUESTS
    screenshot(browser_page, "requests")
    target = sent[-1]
    browser_page.click(f"a[href='#/requests/{target.trace_id}']")
    browser_page.wait_for_selector("table.waterfall")
    browser_page.wait_for_selector(READY)
    rows = browser_page.locator("table.waterfall tbody tr")
    order = [rows.nth(i).get_attribute("data-stage") for i in range(rows.count())]
    assert order == [s.value for s in STAGE_IDS]
    assert browser_page.locator("table.waterfall tr.missing").count() == 0
    modeled = browser_page.locator(f"tr[data-stage='{StageId.HBM_LOAD.value}'] .badge")
    assert modeled.text_content() == "modeled"
    measured = browser_page.locator(f"tr[data-stage='{StageId.ROUTER.value}'] .badge")
    assert measured.text_content() == "measured"
    assert f"{target.input_tokens:,}" in browser_page.text_content("#kpi-input")
    assert browser_page.is_visible("#kpi-naive")
    screenshot(browser_page, "request-waterfall")

    # Cache and leaks: repeated prefixes by fingerprint (never content), histograms.
    _open(browser_page, url, "/leaks")
    assert browser_page.locator(".prefixes-table tbody tr").count() >= 1
    assert browser_page.is_visible("#kpi-long-context")
    # misses by cause: every cause, with the tokens the API gives for the same store
    by_cause = httpx.get(f"{url}/api/leaks").json()["cache"]["by_cause"]
    rows = browser_page.locator(".causes-table tbody tr")
    assert rows.count() == len(by_cause) == 4
    shown = {rows.nth(i).locator("td").nth(0).text_content():
             rows.nth(i).locator("td").nth(1).text_content() for i in range(rows.count())}
    assert shown == {cause: f"{c['tokens']:,}" for cause, c in by_cause.items()}
    assert by_cause["cold"]["tokens"] > 0
    # the leaks ranked, and the last mile as packets per output token, as the API says
    leaks = httpx.get(f"{url}/api/leaks").json()
    ranked = browser_page.locator(".ranked-table tbody tr")
    assert [ranked.nth(i).get_attribute("data-leak") for i in range(ranked.count())] == [
        leak["leak"] for leak in leaks["ranked"]]
    ppt = leaks["last_mile"]["packets_per_output_token"]
    assert browser_page.text_content("#last-mile-ppt") == (
        f"{ppt:,.3f}".rstrip("0").rstrip(".") if ppt is not None else "—")
    screenshot(browser_page, "leaks")

    # What-if: the page opens with the projections (no click); the form refines them.
    _open(browser_page, url, "/whatif")
    assert browser_page.is_visible("#scenario-prefix_affine #wi-routing-hit")
    # the synthetic workload runs on one engine: the routing card says why it gains nothing
    assert "nothing to choose between" in browser_page.text_content("#wi-routing-one-engine")
    for scenario in ("cache", "spec_decode", "int8"):
        assert browser_page.locator(f"#scenario-{scenario} .whatif-table").count() == 1
    browser_page.fill("#wi-cache", "0")
    browser_page.fill("#wi-spec", "2")
    browser_page.select_option("#wi-quant", "int8")
    browser_page.click("#wi-submit")
    browser_page.wait_for_selector("#whatif-result .whatif-table")
    result = browser_page.locator("#whatif-result")
    for metric in ("cost_per_million_output_tokens", "requests_per_second_per_gpu",
                   "ttft_p50_seconds"):
        assert result.locator(f"tr[data-metric='{metric}']").count() == 1
    rps = result.locator("tr[data-metric='requests_per_second_per_gpu']")
    baseline = float(rps.locator(".baseline").text_content())
    projected = float(rps.locator(".projected").text_content())
    assert projected > baseline  # a 2x decode speedup and int8 weights raise throughput
    assert (rps.locator(".change").text_content() or "").endswith("% relative")
    screenshot(browser_page, "whatif")

    assert console.errors == []


def test_overview_updates_live_without_reload(collector: CollectorService,
                                              page: PageAndLog) -> None:
    browser_page, console = page
    url = collector.http_url
    send_workload(url, 5, seed=1)
    wait_for_records(url, 5)
    _open(browser_page, url, "/")
    assert "5 requests" in browser_page.text_content(".lede")
    send_workload(url, 7, seed=2)
    wait_for_records(url, 12)
    browser_page.wait_for_function(
        "document.querySelector('.lede').textContent.startsWith('12 requests')", timeout=15_000)
    assert console.errors == []


def _tab_to(page: Any, href: str, limit: int = 40) -> None:
    for _ in range(limit):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.getAttribute('href')") == href:
            return
    raise AssertionError(f"Tab never reached {href}")


def test_keyboard_navigation_reaches_every_view(collector: CollectorService,
                                                page: PageAndLog) -> None:
    browser_page, console = page
    send_workload(collector.http_url, 3, seed=5)
    wait_for_records(collector.http_url, 3)
    _open(browser_page, collector.http_url, "/")
    for route, heading in (("#/requests", "Requests"), ("#/leaks", "Cache & leaks"),
                           ("#/whatif", "What-if"), ("#/", "Overview")):
        _tab_to(browser_page, route)
        browser_page.keyboard.press("Enter")
        # the new view rendered (not the old one still marked ready before hashchange ran)
        browser_page.wait_for_selector(f"main[data-ready='true'][data-route='{route}']")
        # Focus moves to the new view's heading, and the nav marks the current page.
        assert browser_page.evaluate("document.activeElement.textContent") == heading
        current = browser_page.locator("nav a[aria-current='page']")
        assert current.get_attribute("href") == route
    assert console.errors == []


def test_auth_prompts_for_token_and_then_loads(page: PageAndLog) -> None:
    browser_page, _ = page
    token = "ui-test-token"
    service = start_collector(auth_token=token)
    try:
        url = service.http_url
        headers = {"Authorization": f"Bearer {token}"}
        send_workload(url, 4, seed=3, headers=headers)
        wait_for_records(url, 4, headers=headers)
        assert httpx.get(f"{url}/api/summary", timeout=5).status_code == 401
        assert httpx.get(f"{url}/api/summary", headers={"Authorization": "Bearer nope"},
                         timeout=5).status_code == 401
        assert httpx.get(f"{url}/", timeout=5).status_code == 200  # the shell holds no data

        browser_page.goto(f"{url}/#/")
        browser_page.wait_for_selector("#auth-dialog[open]")
        assert browser_page.get_attribute("main", "data-ready") != "true"
        screenshot(browser_page, "auth-prompt")
        # A wrong token is rejected, forgotten, and asked for again.
        browser_page.fill("#auth-token", "wrong-token")
        browser_page.press("#auth-token", "Enter")
        browser_page.wait_for_function(
            "document.getElementById('auth-message').textContent.includes('rejected')")
        assert browser_page.is_visible("#auth-dialog")
        assert browser_page.evaluate("sessionStorage.getItem('tokenpath.token')") is None
        browser_page.fill("#auth-token", token)
        browser_page.press("#auth-token", "Enter")
        browser_page.wait_for_selector(READY)
        assert "4 requests" in browser_page.text_content(".lede")
        assert not browser_page.is_visible("#auth-dialog")
        assert browser_page.evaluate("sessionStorage.getItem('tokenpath.token')") == token
        # Kept for the tab's session: a reload does not ask again.
        browser_page.reload()
        browser_page.wait_for_selector(READY)
        assert not browser_page.is_visible("#auth-dialog")
    finally:
        service.shutdown()


def test_a_malformed_request_link_shows_an_error_not_the_previous_view(
        collector: CollectorService, page: PageAndLog) -> None:
    browser_page, console = page
    _open(browser_page, collector.http_url, "/leaks")
    browser_page.evaluate("location.hash = '#/requests/abc%zz'")  # not a valid escape
    browser_page.wait_for_selector("#banner:not([hidden])")
    assert "404" in (browser_page.text_content("#banner") or "")
    # The failed fetch may be logged; an uncaught error may not.
    assert [e for e in console.errors if e.startswith("pageerror")] == []


def _nic_point(name: str, device: str, value: float, seconds: float) -> MetricPoint:
    return MetricPoint(name, value, int(seconds * 1e9), {M.LABEL_DEVICE: device},
                       {A.NODE: "demo-host"}, True)


def test_the_nic_table_says_when_the_traffic_is_on_loopback(collector: CollectorService,
                                                            page: PageAndLog) -> None:
    """A single-machine run (tokenpath demo): the agent's NIC counters move only on lo.
    The table names that instead of showing 0 packets/s and a dash for the real NIC."""
    browser_page, console = page
    url = collector.http_url
    _open(browser_page, url, "/leaks")  # no agent yet: said, not an empty table
    assert "no agent pushes NIC counters" in browser_page.text_content(
        "section[aria-label='Last-mile serialization']")
    assert browser_page.locator(".nic-table").count() == 0
    for t, packets, sent in ((10.0, 100, 10_000), (12.0, 2_100, 610_000)):
        collector.node_metrics.consume_points([
            _nic_point(M.NODE_NET_TX_PACKETS.name, "eth0", 7, t),  # idle NIC
            _nic_point(M.NODE_NET_TX_BYTES.name, "eth0", 700, t),
            _nic_point(M.NODE_NET_TX_PACKETS.name, "lo", packets, t),
            _nic_point(M.NODE_NET_TX_BYTES.name, "lo", sent, t),
        ])
    # the view polls: wait for the table rather than reloading on a timer
    browser_page.wait_for_selector(".nic-table", timeout=15_000)
    assert "on loopback" in browser_page.text_content("#nic-loopback-note")
    physical = browser_page.locator(".nic-table tr[data-devices='physical']")
    assert physical.locator("td.no-data").text_content() == (
        "no packets sent between the agent's last two samples")
    assert "0" not in physical.locator("td").nth(2).text_content()
    loopback = browser_page.locator(".nic-table tr[data-devices='loopback'] td")
    assert [loopback.nth(i).text_content() for i in (2, 3)] == ["1,000", "300"]
    assert "loopback: lo" in loopback.nth(1).text_content()
    screenshot(browser_page, "leaks-nic-loopback")
    assert console.errors == []
