"""The UI over a short real demo run: `tokenpath demo` writes its store, a collector serves
that store (as the demo's closing lines tell a user to do), and Chromium looks at it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from tests.collector.ui.conftest import ConsoleLog, screenshot
from tokenpath.cli.demo_cmd import DEMO_SLO_CLASSES
from tokenpath.cli.main import app
from tokenpath.collector.config import CollectorConfig
from tokenpath.collector.service import CollectorService
from tokenpath.slo import OUTCOME_MET, OUTCOME_MISSED, OUTCOMES
from tokenpath.stages import STAGE_IDS

pytestmark = pytest.mark.integration

READY = "main[data-ready='true']"


def _open(page: Any, url: str, route: str) -> None:
    page.goto(f"{url}/#{route}")
    page.wait_for_selector(f"{READY}[data-route='#{route}'], #banner:not([hidden])")
    assert page.is_hidden("#banner"), page.text_content("#banner")


def _signed(value: float) -> str:
    """The page's signed figure: a true minus sign, and ± for no change."""
    sign = "+" if value > 0 else "\N{MINUS SIGN}" if value < 0 else "\N{PLUS-MINUS SIGN}"
    return f"{sign}{abs(value):.1f}"


def _pct(value: float) -> str:
    return f"{value * 100:.1f}%"


def _dollars(value: float) -> str:
    """charts.js fmtDollars, for the sizes a short demo gives."""
    if value == 0:
        return "$0"
    a = abs(value)
    if a >= 100:
        return f"${value:.0f}"
    if a >= 1:
        return f"${value:.2f}"
    if a >= 0.01:
        return f"${value:.4f}"
    if a >= 1e-4:
        return "$" + f"{value:.6f}".rstrip("0")
    return f"${value:.2e}".replace("e-0", "e-")


def _cli(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["whatif", *args, "--format", "json"])
    assert result.exit_code == 0, result.output
    out: dict[str, Any] = json.loads(result.output)
    return out


def _same_projection(page: dict[str, Any], cli: dict[str, Any]) -> None:
    for part in ("baseline", "projected", "change", "change_pp"):
        for key, value in cli[part].items():
            assert page[part][key] == pytest.approx(value, rel=1e-9, abs=1e-12), (part, key)


def _check_whatif_page(browser_page: Any, url: str, store: Path) -> None:
    """The page opens (no click) with the routing projection and the
    default scenarios, the numbers `tokenpath whatif` gives for the same window, a +0.10
    hit-ratio change shown in points and relative changes labelled relative."""
    _open(browser_page, url, "/whatif")
    window = browser_page.locator("#whatif-window")
    since = window.get_attribute("data-since")
    until = window.get_attribute("data-until")
    assert since == "1h" and until  # the header's default window, its end fixed
    flags = ["--since", since, "--until", until]
    page = httpx.get(f"{url}/api/whatif", params={"since": since, "until": until},
                     timeout=30).json()
    scenarios = {s["id"]: s for s in page["scenarios"]}

    # The routing projection, as `tokenpath whatif --router prefix-affine` gives it.
    routed = _cli("--collector", url, *flags, "--router", "prefix-affine")
    r = routed["routing"]
    assert scenarios["prefix_affine"]["routing"] == pytest.approx(r)
    _same_projection(scenarios["prefix_affine"], routed)
    assert r["hit_ratio_gain"] > 0 and r["provenance"] == "modeled"
    card = browser_page.locator("#scenario-prefix_affine")
    assert "modeled" in card.locator("h2 .badge").text_content()
    assert card.locator("#wi-routing-hit .kpi-value").text_content() == (
        f"{_pct(r['recorded_hit_ratio'])} \N{RIGHTWARDS ARROW} {_pct(r['predicted_hit_ratio'])}")
    assert card.locator("#wi-routing-hit .kpi-sub").text_content() == (
        f"{_signed(r['hit_ratio_gain'] * 100)} pp (percentage points)")
    assert card.locator("#wi-routing-tokens .kpi-value").text_content() == (
        f"{r['prefill_tokens_saved']:,}")
    assert card.locator("#wi-routing-dollars .kpi-value").text_content() == _dollars(
        r["prefill_dollars_saved"])
    assert card.locator("#wi-routing-skew .kpi-value").text_content() == (
        f"{r['load_skew_recorded']:.2f} \N{RIGHTWARDS ARROW} {r['load_skew_predicted']:.2f}")
    assert "replayed" in card.text_content()  # what it is calibrated on
    # the form's endpoint with the router says the same for the same window
    form = httpx.post(f"{url}/api/whatif", params={"since": since, "until": until},
                      json={"router": "prefix_affine"}, timeout=30).json()
    assert form["routing"] == scenarios["prefix_affine"]["routing"]
    assert form["projected"] == scenarios["prefix_affine"]["projected"]

    # The baseline and the default scenarios, as the CLI gives them (from the store too).
    plain = _cli("--store", str(store), *flags)
    for part in ("baseline",):
        assert page[part] == pytest.approx(plain[part])
    for id_, cli_flags in (("cache", ["--cache-hit-rate", "+0.10"]),
                           ("spec_decode", ["--spec-decode-speedup", "2"]),
                           ("int8", ["--quantization", "int8"])):
        scenario = scenarios[id_]
        assert scenario["cli_flags"] == cli_flags
        _same_projection(scenario, _cli("--collector", url, *flags, *cli_flags))
        section = browser_page.locator(f"#scenario-{id_}")
        assert "modeled" in section.locator("h2 .badge").text_content()
        assert "Calibrated on" in section.text_content()
        for key in ("cost_per_million_output_tokens", "requests_per_second_per_gpu",
                    "ttft_p50_seconds"):  # relative changes, labelled so
            cell = section.locator(f"tr[data-metric='{key}'] .change").text_content()
            relative = scenario["change"][key]
            assert cell == f"{_signed(relative * 100)}% relative", (id_, key, cell)
        hit = section.locator("tr[data-metric='prefix_cache_hit_ratio']")
        assert hit.get_attribute("data-unit") == "pp"
        assert hit.locator(".projected").text_content() == _pct(
            scenario["projected"]["prefix_cache_hit_ratio"])
        assert hit.locator(".change").text_content() == (
            f"{_signed(scenario['change_pp']['prefix_cache_hit_ratio'])} pp")

    # +0.10 is ten points, shown and explained in points: asked, applied or capped.
    cache = scenarios["cache"]
    limit = cache["cache_hit_rate"]
    assert limit["asked_delta"] == pytest.approx(0.10)
    assert browser_page.locator("#scenario-cache h2").text_content().startswith(
        "Prefix-cache hit ratio +10 pp")
    explained = browser_page.locator("#scenario-cache .note.cap").text_content()
    assert explained.startswith("Hit ratio: +10.0 pp asked")
    if limit["capped"]:
        assert f"{_signed(limit['possible_delta'] * 100)} pp possible: only" in explained
    else:
        assert cache["change_pp"]["prefix_cache_hit_ratio"] == pytest.approx(10.0, abs=0.1)
        assert "applied" in explained
    assert f"{_pct(limit['cacheable_hit_ratio'])} of prompt tokens repeat" in explained
    assert "+10.0 pp" in browser_page.text_content("#wi-cache-hint")


def _rate(value: float) -> str:
    """views' rate(): up to 3 decimals, thousands separated (toLocaleString en-US)."""
    text = f"{value:,.3f}".rstrip("0").rstrip(".")
    return text


def _check_slo(browser_page: Any, url: str, store: Path, summary: dict[str, Any]) -> None:
    """The demo's two SLO classes: every record classified (acme's interactive, the rest
    batch), met + missed + unknown = all, the classes' dollars the records' dollars; the
    CLI's report, /api and the page give the same goodput and dollars per good request."""
    records = httpx.get(f"{url}/api/requests", params={"limit": 10_000}, timeout=30).json()
    assert len(records) == summary["requests"]
    names = [c.name for c in DEMO_SLO_CLASSES.classes]
    assert names == ["interactive", "batch"]
    for r in records:
        assert r["slo"] == ("interactive" if r["tenant"] == "acme" else "batch"), r
        assert r["slo_outcome"] in OUTCOMES, r
        assert (r["slo_miss_stage"] is not None) == (r["slo_outcome"] == OUTCOME_MISSED), r
    slo = summary["slo"]
    assert slo["met"] + slo["missed"] + slo["unknown"] == len(records)
    by_class = {c["slo"]: c for c in slo["classes"]}
    assert set(by_class) == set(names)
    for name, c in by_class.items():
        mine = [r for r in records if r["slo"] == name]
        assert c["met"] + c["missed"] + c["unknown"] == c["requests"] == len(mine)
        assert c["met"] == sum(r["slo_outcome"] == OUTCOME_MET for r in mine)
        assert c["cost_dollars"] == pytest.approx(sum(r["cost_dollars"] for r in mine),
                                                  rel=1e-9, abs=1e-12)
        if c["met"]:
            assert c["dollars_per_good_request"] == pytest.approx(c["cost_dollars"] / c["met"])
            assert c["goodput_requests_per_second"] == pytest.approx(
                c["met"] / summary["window_seconds"])
    total = sum(r["cost_dollars"] for r in records)
    assert sum(c["cost_dollars"] for c in slo["classes"]) == pytest.approx(total, rel=1e-9)
    assert slo["cost_dollars"] == pytest.approx(summary["cost_dollars"], rel=1e-9)
    assert slo["goodput_requests_per_second"] > 0 and slo["dollars_per_good_request"] > 0
    # a tight TTFT target on the interactive class: the demo misses some of it, and each
    # miss names where its time went
    assert by_class["interactive"]["missed"] > 0
    assert sum(by_class["interactive"]["missed_by_stage"].values()) == \
        by_class["interactive"]["missed"]

    report = CliRunner().invoke(app, ["report", "--store", str(store), "--format", "json"])
    assert report.exit_code == 0, report.output
    cli = json.loads(report.output)["slo"]
    for key in ("met", "missed", "unknown", "gpus_billed"):
        assert cli[key] == slo[key], key
    for key in ("goodput_requests_per_second", "dollars_per_good_request", "missed_dollars"):
        assert cli[key] == pytest.approx(slo[key], rel=1e-9), key

    _open(browser_page, url, "/")
    assert browser_page.text_content("#kpi-goodput .kpi-value") == (
        f"{_rate(slo['goodput_requests_per_second'])} req/s")
    assert browser_page.text_content("#kpi-good-request .kpi-value") == _dollars(
        slo["dollars_per_good_request"])
    assert browser_page.text_content("#leak-slo-missed .leak-value") == _dollars(
        slo["missed_dollars"])
    for name, c in by_class.items():
        row = browser_page.locator(f"table.slo-table tr[data-slo='{name}']")
        objective = DEMO_SLO_CLASSES.by_name(name)
        assert objective is not None and c["objective"] == objective.objective
        assert row.locator(".objective").text_content() == f"{objective.objective:.2%}"
        assert row.locator(".goodput").text_content() == _rate(
            c["goodput_requests_per_second"])
        assert row.locator(".per-good").text_content() == (
            _dollars(c["dollars_per_good_request"]) if c["met"] else "\N{EM DASH}")
        assert row.locator(".missed").text_content() == _dollars(c["missed_dollars"])
    # chargeback by tenant: each tenant's dollars per good request, as /api/chargeback
    rows = httpx.get(f"{url}/api/chargeback", timeout=30).json()["rows"]
    for r in rows:
        mine = [x for x in records if (x["tenant"] or "unattributed") == r["tenant"]]
        assert r["good_requests"] == sum(x["slo_outcome"] == OUTCOME_MET for x in mine)
        assert r["missed_slo_dollars"] == pytest.approx(
            sum(x["cost_dollars"] for x in mine if x["slo_outcome"] == OUTCOME_MISSED),
            rel=1e-9, abs=1e-12)
        cell = browser_page.locator(f"table.tenants-table tr[data-tenant='{r['tenant']}'] "
                                    ".per-good").text_content()
        assert cell == (_dollars(r["dollars_per_good_request"]) if r["good_requests"]
                        else "\N{EM DASH}")
    screenshot(browser_page, "demo-slo")


def test_ui_shows_a_short_demo(tmp_path: Path, page: tuple[Any, ConsoleLog]) -> None:
    store = tmp_path / "demo.db"
    demo = subprocess.run(
        [sys.executable, "-m", "tokenpath.cli.main", "demo", "--duration", "4", "--rps", "6",
         "--time-scale", "0.05", "--store", str(store), "--collector-http", "127.0.0.1:0",
         "--agent-listen", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=180, check=False)
    assert demo.returncode == 0, demo.stdout + demo.stderr

    # the demo's classes, as a user's collector config gives them: their objectives shown
    service = CollectorService(CollectorConfig(http_port=0, grpc_port=None,
                                               store_path=str(store), slo=DEMO_SLO_CLASSES))
    service.start()
    browser_page, console = page
    try:
        url = service.http_url
        summary = httpx.get(f"{url}/api/summary", timeout=10).json()
        assert summary["requests"] > 5 and summary["cost_dollars"] > 0
        _check_slo(browser_page, url, store, summary)

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

        _check_whatif_page(browser_page, url, store)
        screenshot(browser_page, "demo-whatif")

        # the form refines over the same window: 2x decode lowers the unit cost
        browser_page.fill("#wi-cache", "0")
        browser_page.fill("#wi-spec", "2")
        browser_page.click("#wi-submit")
        browser_page.wait_for_selector("#whatif-result .whatif-table")
        cost = browser_page.locator(
            "#whatif-result tr[data-metric='cost_per_million_output_tokens']")
        assert float(cost.locator(".projected").text_content().lstrip("$").replace(",", "")) < \
            float(cost.locator(".baseline").text_content().lstrip("$").replace(",", ""))
        assert console.errors == []
    finally:
        service.shutdown()
