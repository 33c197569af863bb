"""The what-if page's projections (GET /api/whatif) and the hit-ratio cap.

A hit-ratio change is in percentage points of the window's prompt tokens and cannot pass
what the window's repeats allow; the routing projection lands on the router replay's hit
ratio; the page's scenarios are what ``tokenpath whatif`` answers for the same flags."""

from __future__ import annotations

import math

import pytest

from tokenpath.collector.cost.prices import load_price_sheet
from tokenpath.collector.cost.routing_whatif import prefix_affine_whatif
from tokenpath.collector.cost.whatif import Scenario, calibrate, repeatable_tokens, what_if
from tokenpath.collector.cost.whatif_overview import WhatIfWindow, run_whatif, whatif_overview
from tokenpath.config import ConfigError
from tokenpath.records import RequestRecord

PRICES = load_price_sheet()
BLOCK = 16


def _record(i: int, fingerprints: tuple[str, ...], input_tokens: int, cached: int,
            engine: str, at: float) -> RequestRecord:
    record = RequestRecord(trace_id=f"{i:032x}", model="llama-3.1-8b", node="node-a",
                           input_tokens=input_tokens, output_tokens=40,
                           cache_read_tokens=cached, start_unix=at, end_unix=at + 1.0,
                           prefill_start_unix=at, decode_start_unix=at + 0.05,
                           engine_end_unix=at + 0.9, ttft_seconds=0.08,
                           prefix_fingerprints=fingerprints, prefix_block_tokens=BLOCK)
    record.engine_id = engine
    return record


def _workload(requests: int = 40) -> list[RequestRecord]:
    """Two shared system prompts (8 blocks each) behind unique user turns (4 blocks), sent
    round-robin over two engines, whose caches served half of each repeated prompt."""
    records = []
    for i in range(requests):
        family = i % 2
        system = tuple(f"sys-{family}-{b}" for b in range(8))
        user = tuple(f"user-{i}-{b}" for b in range(4))
        engine = f"engine-{(i // 2) % 2}"
        cached = 4 * BLOCK if i >= 4 else 0
        records.append(_record(i, system + user, 12 * BLOCK + 5, cached, engine, 1000.0 + i))
    return records


def test_repeatable_tokens_are_the_deepest_prefix_an_earlier_request_carried() -> None:
    records = _workload(6)
    repeats = repeatable_tokens(records)
    assert [repeats[r.record_id] for r in records] == [0, 0] + [8 * BLOCK] * 4


def test_a_hit_ratio_change_past_the_repeats_is_capped_and_says_so() -> None:
    records = _workload()
    calibration = calibrate(records, PRICES)
    # 8 of every 12 blocks (and 5 unfingerprinted tokens) repeat, bar the first two prompts
    inputs = sum(r.input_tokens for r in records)
    assert calibration.cacheable_ratio == pytest.approx(38 * 8 * BLOCK / inputs)
    small = what_if(records, PRICES, Scenario(cache_hit_rate_delta=0.05))
    assert small["change_pp"]["prefix_cache_hit_ratio"] == pytest.approx(5.0, abs=0.01)
    assert small["cache_hit_rate"]["capped"] is False
    big = what_if(records, PRICES, Scenario(cache_hit_rate_delta=0.5))
    limit = big["cache_hit_rate"]
    assert limit["capped"] is True and limit["asked_delta"] == 0.5
    assert limit["possible_delta"] == pytest.approx(
        calibration.cacheable_ratio - big["baseline"]["prefix_cache_hit_ratio"])
    assert limit["applied_delta"] == pytest.approx(limit["possible_delta"])
    assert big["projected"]["prefix_cache_hit_ratio"] == pytest.approx(
        calibration.cacheable_ratio)
    # ratios change in points, dollars and throughput relatively
    assert big["change_pp"]["prefix_cache_hit_ratio"] == pytest.approx(
        limit["applied_delta"] * 100)
    assert big["change"]["cost_per_million_output_tokens"] <= 0  # relative: short prompts
    # of an 8B model are weight-bound, so caching them barely moves the dollars


def test_room_left_by_a_full_request_goes_to_the_others() -> None:
    """Water-filling: the first two prompts cannot cache anything (nothing came before),
    yet +10 pp over the window is reached, as the others have room for it."""
    records = _workload()
    out = what_if(records, PRICES, Scenario(cache_hit_rate_delta=0.10))
    assert out["change_pp"]["prefix_cache_hit_ratio"] == pytest.approx(10.0, abs=0.05)
    assert out["cache_hit_rate"]["capped"] is False


def test_the_routing_projection_lands_on_the_replayed_hit_ratio() -> None:
    records = _workload()
    routing = prefix_affine_whatif(records)
    assert routing.hit_ratio_gain is not None and routing.hit_ratio_gain > 0
    out = run_whatif(records, PRICES, Scenario(), "prefix-affine")
    assert out["routing"]["predicted_hit_ratio"] == routing.predicted_hit_ratio
    # the roofline's hit ratio caps each request at all but its last prompt token
    assert out["projected"]["prefix_cache_hit_ratio"] == pytest.approx(
        routing.predicted_hit_ratio, abs=1e-3)
    assert out["scenario"]["cache_hit_rate_delta"] == routing.hit_ratio_gain
    # an explicit change wins over the router's
    given = run_whatif(records, PRICES, Scenario(cache_hit_rate_delta=0.0), "prefix_affine",
                       explicit_cache_change=True)
    assert given["projected"]["prefix_cache_hit_ratio"] == given["baseline"][
        "prefix_cache_hit_ratio"]


def test_the_overview_is_the_cli_s_answer_for_each_scenario() -> None:
    records = _workload()
    window = WhatIfWindow.resolve("1h", 1100.0)
    out = whatif_overview(records, PRICES, window)
    assert out["unavailable"] is None and out["provenance"] == "modeled"
    assert out["window"] == {"since": "1h", "since_unix": 1100.0 - 3600, "until_unix": 1100.0,
                             "records": len(records)}
    assert out["cli_flags"] == ["--since", "1h", "--until", "1100.0"]
    by_id = {s["id"]: s for s in out["scenarios"]}
    assert list(by_id) == ["prefix_affine", "cache", "spec_decode", "int8"]
    cli = {
        "prefix_affine": run_whatif(records, PRICES, Scenario(), "prefix-affine"),
        "cache": run_whatif(records, PRICES, Scenario(cache_hit_rate_delta=0.10)),
        "spec_decode": run_whatif(records, PRICES, Scenario(spec_decode_speedup=2.0)),
        "int8": run_whatif(records, PRICES, Scenario(quantization="int8")),
    }
    for key, scenario in by_id.items():
        assert scenario["provenance"] == "modeled" and scenario["calibrated_on"]
        for part in ("baseline", "projected", "change", "change_pp", "cache_hit_rate"):
            assert scenario[part] == cli[key][part], (key, part)
    assert by_id["prefix_affine"]["routing"] == cli["prefix_affine"]["routing"]
    assert by_id["prefix_affine"]["cli_flags"] == ["--router", "prefix-affine"]
    assert "replayed" in by_id["prefix_affine"]["calibrated_on"]
    assert by_id["cache"]["title"] == "Prefix-cache hit ratio +10 pp"
    assert "acceptance" in by_id["spec_decode"]["calibrated_on"]
    assert out["calibration"]["requests"] == len(records)


def test_an_empty_window_or_one_without_fingerprints_says_why() -> None:
    out = whatif_overview([], PRICES, WhatIfWindow.resolve(None, 5.0))
    assert out["scenarios"] == [] and "no complete request" in out["unavailable"]
    plain = [_record(i, (), 300, 100, "engine-0", 1000.0 + i) for i in range(5)]
    out = whatif_overview(plain, PRICES, WhatIfWindow.resolve(None, 2000.0))
    routing = out["scenarios"][0]
    assert routing["id"] == "prefix_affine" and "fingerprints" in routing["unavailable"]
    assert "projected" not in routing
    assert out["scenarios"][1]["cache_hit_rate"]["basis"].startswith("no prefix fingerprints")


def test_the_window_counts_back_from_until_and_names_a_bad_value() -> None:
    window = WhatIfWindow.resolve("30m", 10_000.0)
    assert (window.since_unix, window.until_unix) == (10_000.0 - 1800, 10_000.0)
    now = WhatIfWindow.resolve(None, None, now=42.0)
    assert now.since_unix is None and now.until_unix == 42.0
    for since, until, key in (("soon", None, "since"), ("1h", math.inf, "until"),
                              (None, math.nan, "until")):
        with pytest.raises(ConfigError) as caught:
            WhatIfWindow.resolve(since, until)
        assert caught.value.key == key
