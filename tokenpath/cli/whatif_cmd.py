"""``tokenpath whatif``: projections from the roofline model, calibrated on recorded requests.

Reads the recorded requests from ``--store``, ``--collector`` or ``--records`` (the JSON of
``tokenpath requests --format json``) and prints the baseline beside the projection
(docs/reference.md). ``--since`` counts back from ``--until`` (now without it), the window the
UI's what-if page names, so the page and this command read the same requests. Formulas:
docs/cost-model.md. All figures are modeled: ratios change in percentage points, dollars,
throughput and latency relatively.
"""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Any

import typer
from rich.table import Table
from rich.text import Text

from tokenpath import views
from tokenpath.cli.client import Source
from tokenpath.cli.common import console, fail
from tokenpath.collector.cost.prices import load_price_sheet
from tokenpath.collector.cost.whatif import (
    DEFAULT_SPEC_DRAFT_TOKENS,
    QUANTIZATION,
    Scenario,
    WhatIfError,
    calibrate,
    speculative_speedup,
)
from tokenpath.collector.cost.whatif_overview import WhatIfWindow, run_whatif
from tokenpath.collector.cost.whatif_rules import check_rules_of_thumb
from tokenpath.config import ConfigError
from tokenpath.endpoints import COLLECTOR_URL
from tokenpath.query import Window as QueryWindow
from tokenpath.records import RequestRecord


class OutputFormat(StrEnum):
    TABLE = "table"
    JSON = "json"


def parse_cache_hit_rate(value: str, current: float) -> float:
    """``+0.10``/``-0.05`` is a change in the hit rate; ``0.6`` is a target rate."""
    text = value.strip()
    try:
        number = float(text)
    except ValueError:
        fail(f"--cache-hit-rate: not a number: {value!r} (use +0.10 or 0.6)")
    if text.startswith(("+", "-")):
        return number
    if not 0 <= number <= 1:
        fail("--cache-hit-rate: a target rate must be within [0, 1]")
    return number - current


def _load_records(store: str | None, collector: str | None, records_file: Path | None,
                  window: WhatIfWindow) -> list[RequestRecord]:
    if records_file is not None:
        try:
            data = json.loads(records_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            fail(f"--records: cannot read {records_file}: {exc}")
        if not isinstance(data, list):
            fail("--records: expected the JSON list of `tokenpath requests --format json`")
        try:
            loaded = [RequestRecord.from_json(item) for item in data]
        except (KeyError, TypeError, ValueError) as exc:
            fail(f"--records: not a request record: {exc}")
        return [r for r in loaded if r.end_unix <= window.until_unix
                and (window.since_unix is None or r.end_unix >= window.since_unix)]
    # the newest of the window, capped in total over the collectors or from the store
    with Source(store, collector).queries() as opened:
        return views.whatif_sample(opened, QueryWindow(window.since_unix,
                                                       window.until_unix)).records


# (label, key, format, kind): "pp" ratios change in percentage points, "rel" relatively
ROWS: tuple[tuple[str, str, str, str], ...] = (
    ("$ per million output tokens", "cost_per_million_output_tokens", ".4f", "rel"),
    ("requests/s per GPU", "requests_per_second_per_gpu", ".3f", "rel"),
    ("TTFT p50 (s)", "ttft_p50_seconds", ".4f", "rel"),
    ("goodput/s per GPU (SLO outcomes as recorded)", "goodput_per_gpu", ".3f", "rel"),
    ("$ per good request", "dollars_per_good_request", ".6f", "rel"),
    ("GPU utilization", "gpu_utilization", ".1%", "pp"),
    ("prefix-cache hit ratio", "prefix_cache_hit_ratio", ".1%", "pp"),
)


def _row(result: dict[str, Any], name: str, key: str, fmt: str, kind: str) -> list[str]:
    base, projected = result["baseline"][key], result["projected"][key]

    def show(value: Any) -> str:
        return "-" if value is None else format(value, fmt)

    if kind == "pp":
        points = result["change_pp"][key]
        change = f"{points:+.1f} pp"
    else:
        relative = result["change"][key]
        change = "-" if relative is None else f"{relative * 100:+.1f}% relative"
    return [name, show(base), show(projected), change]


def cache_note(limit: dict[str, Any]) -> str | None:
    """Beside a capped hit-ratio change: what was asked, what the repeats allow."""
    if not limit["capped"]:
        return None
    return (f"hit ratio {limit['asked_delta'] * 100:+.1f} pp asked, "
            f"{limit['possible_delta'] * 100:+.1f} pp possible: only "
            f"{limit['cacheable_hit_ratio']:.1%} of prompt tokens repeat an earlier "
            f"prefix in the window ({limit['basis']})")


def _render(result: dict[str, Any]) -> None:
    table = Table(title="what-if (modeled, calibrated on the recorded requests; ratios "
                        "change in percentage points, the rest relatively)")
    for column in ("metric", "baseline", "projected", "change"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    for name, key, fmt, kind in ROWS:
        table.add_row(*_row(result, name, key, fmt, kind))
    console.print(table)
    note = cache_note(result["cache_hit_rate"])
    if note:
        console.print(Text(note))
    spend = Table(title="spend by context length (attention share of prefill FLOPs, modeled)")
    for column in ("context tokens", "requests", "share of spend", "attention share"):
        spend.add_column(column, justify="left" if column == "context tokens" else "right")
    for bucket in result["long_context"]:
        if bucket["requests"]:
            spend.add_row(bucket["bucket"], str(bucket["requests"]),
                          f"{bucket['share_of_spend']:.1%}", f"{bucket['attention_share']:.1%}")
    console.print(spend)
    prefixes = [p for p in result["top_prefixes_by_waste"] if p["waste_dollars"] > 0]
    if prefixes:
        waste = Table(title="repeated prefixes recomputed (fingerprints only)")
        for column in ("fingerprint", "prefix tokens", "count", "hits", "misses", "waste $"):
            waste.add_column(column, justify="left" if column == "fingerprint" else "right")
        for p in prefixes:
            waste.add_row(Text(p["fingerprint"][:16]), str(p["prefix_tokens"]), str(p["count"]),
                          str(p["hits"]), str(p["misses"]), f"{p['waste_dollars']:.6f}")
        console.print(waste)
    routing = result.get("routing")
    if routing:
        routed = Table(title="prefix-affine router (modeled: the recorded fingerprints "
                             "replayed, cache capacity fitted on the recorded hits)")
        for column in ("figure", "value"):
            routed.add_column(column, justify="left" if column == "figure" else "right")
        for name, key, fmt in (
            ("hit ratio recorded", "recorded_hit_ratio", ".1%"),
            ("hit ratio with the router", "predicted_hit_ratio", ".1%"),
            ("prefill tokens saved", "prefill_tokens_saved", ",d"),
            ("prefill $ saved", "prefill_dollars_saved", ".6f"),
            ("load skew recorded (busiest / mean)", "load_skew_recorded", ".2f"),
            ("load skew with the router", "load_skew_predicted", ".2f"),
        ):
            value = routing[key]
            routed.add_row(name, "-" if value is None else format(value, fmt))
        gain = routing["hit_ratio_gain"]
        routed.add_row("hit ratio change", "-" if gain is None else f"{gain * 100:+.1f} pp")
        console.print(routed)
    rules = result.get("rules_of_thumb")
    if rules:
        checks = Table(title="rules of thumb on your workload (modeled)")
        for column in ("claim", "rule of thumb", "model on your traffic", "agrees"):
            checks.add_column(column)
        for rule in rules:
            checks.add_row(rule["claim"], rule["rule_of_thumb"], rule["model_says"],
                           "yes" if rule["agrees"] else "no")
        console.print(checks)


def register(app: typer.Typer) -> None:
    @app.command("whatif")
    def whatif(
        store: str | None = typer.Option(None, help="Store path (default $TOKENPATH_STORE)."),
        collector: str | None = typer.Option(None, help="Read from a running collector, "
                                             f"e.g. {COLLECTOR_URL}."),
        records: Path | None = typer.Option(None, help="JSON of `tokenpath requests "
                                            "--format json` instead of a store."),
        prices: Path | None = typer.Option(None, help="Price sheet YAML (default: shipped)."),
        cache_hit_rate: str | None = typer.Option(None, help="+0.10 (change) or 0.6 (target)."),
        spec_decode_speedup: float | None = typer.Option(None, help="Decode speedup, e.g. 2.0."),
        spec_acceptance: float | None = typer.Option(None, help="Draft acceptance rate (0-1); "
                                                     "speedup computed from it."),
        spec_draft_tokens: int = typer.Option(DEFAULT_SPEC_DRAFT_TOKENS,
                                              help="Draft length with --spec-acceptance."),
        gpu_utilization: float | None = typer.Option(None, help="Target GPU utilization (0-1]."),
        quantization: str | None = typer.Option(None, help="|".join(QUANTIZATION)),
        rules_of_thumb: bool = typer.Option(False, "--rules-of-thumb",
                                            help="Check industry claims on this workload."),
        router: str | None = typer.Option(
            None, help="prefix-affine: replay the recorded fingerprints through a "
                       "prefix-affine router and project at its cache-hit gain."),
        since: str | None = typer.Option(None, help="Only requests that ended within this "
                                         "duration (e.g. 1h) before --until."),
        until: float | None = typer.Option(None, help="The window's end, unix seconds "
                                           "(default now): the UI's what-if page names "
                                           "it, so both read the same requests."),
        format: OutputFormat = typer.Option(OutputFormat.TABLE, "--format"),
    ) -> None:
        """Project cost and throughput under better caching, batching, spec decoding or
        quantization."""
        try:
            sheet = load_price_sheet(prices)
        except ConfigError as exc:
            fail(f"--prices: {exc}")
        if router is not None and router.replace("_", "-") != "prefix-affine":
            fail(f"--router: {router!r}: the one router modeled is prefix-affine")
        try:
            window = WhatIfWindow.resolve(since, until)
        except ConfigError as exc:
            fail(f"--{exc.key}: {exc.message}")
        recorded = _load_records(store, collector, records, window)
        try:
            calibration = calibrate(recorded, sheet)
            speedup = 1.0 if spec_decode_speedup is None else spec_decode_speedup
            if spec_acceptance is not None:
                speedup = speculative_speedup(spec_acceptance, spec_draft_tokens)
            delta = (parse_cache_hit_rate(cache_hit_rate, calibration.hit_ratio)
                     if cache_hit_rate is not None else 0.0)
            scenario = Scenario(
                cache_hit_rate_delta=delta,
                spec_decode_speedup=speedup,
                gpu_utilization=gpu_utilization,
                quantization=quantization,
            )
            result = run_whatif(recorded, sheet, scenario, router,
                                explicit_cache_change=cache_hit_rate is not None,
                                calibration=calibration)
            result["window"] = {**window.to_json(), "records": len(recorded)}
            if rules_of_thumb:
                result["rules_of_thumb"] = [c.to_json() for c in check_rules_of_thumb(calibration)]
        except WhatIfError as exc:
            fail(str(exc))
        if format is OutputFormat.JSON:
            print(json.dumps(result, indent=2))
        else:
            _render(result)
