"""What-if sanity from first principles."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from testkit.fakes.clock import FakeClock
from tokenpath.cli.main import app
from tokenpath.collector.cost.attributor import AttributorConfig, CostAttributor
from tokenpath.collector.cost.prices import load_price_sheet
from tokenpath.collector.cost.stepsim import random_workload, simulate
from tokenpath.collector.cost.whatif import (
    Scenario,
    WhatIfError,
    calibrate,
    project,
    speculative_speedup,
    what_if,
)
from tokenpath.collector.cost.whatif_rules import check_rules_of_thumb
from tokenpath.records import RequestRecord
from tokenpath.roofline import roofline_for

from .helpers import RecordingSink

PRICES = load_price_sheet()


@pytest.fixture(scope="module")
def recorded() -> list[RequestRecord]:
    roofline = roofline_for("H100-SXM", "llama-3.1-8b")
    result = simulate(random_workload(11, 150, 3.0), roofline,
                      PRICES.gpus["H100-SXM"].dollars_per_second)
    sink = RecordingSink()
    cost = CostAttributor(sink, PRICES, clock=FakeClock(),
                          config=AttributorConfig(tick_seconds=0))
    for record in result.records:
        cost.consume_record(record)
    cost.shutdown()
    return sink.records


def test_utilization_half_to_eighty_percent_cuts_unit_cost_by_37_5_percent(
        recorded: list[RequestRecord]) -> None:
    calibration = calibrate(recorded, PRICES)
    at_half = project(calibration, Scenario(gpu_utilization=0.5))
    at_eighty = project(calibration, Scenario(gpu_utilization=0.8))
    change = at_eighty.cost_per_million_output_tokens / at_half.cost_per_million_output_tokens
    assert math.isclose(1 - change, 0.375, rel_tol=1e-9)
    assert at_eighty.ttft_p50_seconds == at_half.ttft_p50_seconds


def test_higher_cache_hit_rate_lowers_cost_and_ttft(recorded: list[RequestRecord]) -> None:
    result = what_if(recorded, PRICES, Scenario(cache_hit_rate_delta=0.2))
    base, proj = result["baseline"], result["projected"]
    assert proj["prefix_cache_hit_ratio"] > base["prefix_cache_hit_ratio"]
    assert proj["cost_per_million_output_tokens"] < base["cost_per_million_output_tokens"]
    assert proj["ttft_p50_seconds"] < base["ttft_p50_seconds"]
    assert proj["requests_per_second_per_gpu"] > base["requests_per_second_per_gpu"]


def test_baseline_is_calibrated_to_the_attributed_cost(recorded: list[RequestRecord]) -> None:
    calibration = calibrate(recorded, PRICES)
    baseline = project(calibration, Scenario())
    attributed = sum(r.gpu_cost_dollars for r in recorded)
    assert math.isclose(baseline.cost_dollars * calibration.utilization, attributed,
                        rel_tol=1e-6)


def test_spec_decoding_and_quantization_lower_decode_cost(recorded: list[RequestRecord]) -> None:
    calibration = calibrate(recorded, PRICES)
    base = project(calibration, Scenario())
    spec = project(calibration, Scenario(spec_decode_speedup=2.0))
    assert math.isclose(spec.decode_gpu_seconds, base.decode_gpu_seconds / 2, rel_tol=1e-9)
    assert spec.prefill_gpu_seconds == base.prefill_gpu_seconds
    int8 = project(calibration, Scenario(quantization="int8"))
    int4 = project(calibration, Scenario(quantization="int4"))
    assert int4.decode_gpu_seconds < int8.decode_gpu_seconds < base.decode_gpu_seconds


def test_speculative_speedup_formula() -> None:
    # acceptance 0 accepts nothing: one token per step, paying for the drafts
    assert math.isclose(speculative_speedup(0.0, 4, draft_cost_ratio=0.05), 1 / 1.2)
    # acceptance 0.8, 4 drafts: (1 - 0.8^5) / 0.2 = 3.3616 tokens per step
    assert math.isclose(speculative_speedup(0.8, 4, draft_cost_ratio=0.0), 3.3616)
    with pytest.raises(WhatIfError):
        speculative_speedup(1.0, 4)


def test_invalid_scenarios_are_rejected(recorded: list[RequestRecord]) -> None:
    calibration = calibrate(recorded, PRICES)
    for scenario in (Scenario(gpu_utilization=1.5), Scenario(quantization="int2"),
                     Scenario(spec_decode_speedup=0)):
        with pytest.raises(WhatIfError):
            project(calibration, scenario)
    with pytest.raises(WhatIfError):
        calibrate([], PRICES)


def test_rules_of_thumb_cover_every_claim(recorded: list[RequestRecord]) -> None:
    checks = check_rules_of_thumb(calibrate(recorded, PRICES))
    assert [c.claim for c in checks] == [
        "+1 pp prefix-cache hit rate",
        "speculative decoding",
        "GPU utilization 50% -> 80% (continuous batching)",
        "prompt caching of repeated prefixes",
        "no caching + no quantization + long contexts",
    ]
    by_claim = {c.claim: c for c in checks}
    assert math.isclose(by_claim["GPU utilization 50% -> 80% (continuous batching)"].value,
                        -0.375, rel_tol=1e-9)
    assert by_claim["no caching + no quantization + long contexts"].value < 1.0


def test_cli_json_has_the_spec_fields(recorded: list[RequestRecord], tmp_path: Path) -> None:
    path = tmp_path / "requests.json"
    path.write_text(json.dumps([r.to_json() for r in recorded]))
    result = CliRunner().invoke(app, [
        "whatif", "--records", str(path), "--cache-hit-rate", "+0.10",
        "--gpu-utilization", "0.8", "--quantization", "int8", "--rules-of-thumb",
        "--format", "json",
    ])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    for side in ("baseline", "projected"):
        for key in ("cost_per_million_output_tokens", "requests_per_second_per_gpu",
                    "ttft_p50_seconds"):
            assert isinstance(data[side][key], float)
    assert len(data["rules_of_thumb"]) == 5
    assert data["provenance"] == "modeled"
    assert sum(b["requests"] for b in data["long_context"]) == len(recorded)
    assert data["top_prefixes_by_waste"]  # the workload repeats its system prompts
    table = CliRunner().invoke(app, ["whatif", "--records", str(path),
                                     "--spec-acceptance", "0.7"])
    assert table.exit_code == 0 and "requests/s per GPU" in table.output


def test_cli_rejects_bad_input_without_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    result = CliRunner().invoke(app, ["whatif", "--records", str(bad)])
    assert result.exit_code == 2
    assert "--records" in result.output
    prices = tmp_path / "prices.yaml"
    prices.write_text("gpus: {H100-SXM: {dollars_per_hour: -1}}\n")
    result = CliRunner().invoke(app, ["whatif", "--records", str(bad), "--prices", str(prices)])
    assert result.exit_code == 2
    assert "gpus.H100-SXM.dollars_per_hour" in result.output


def test_projections_give_goodput_and_dollars_per_good_request(
        recorded: list[RequestRecord]) -> None:
    import dataclasses

    from tokenpath.slo import OUTCOME_MET, OUTCOME_MISSED, SloClass, SloConfig, classify_record

    unclassified = project(calibrate(recorded, PRICES), Scenario())
    assert unclassified.goodput_per_gpu is None
    assert unclassified.dollars_per_good_request is None
    classes = SloConfig((SloClass("c", ttft_seconds=sorted(
        r.ttft_seconds for r in recorded if r.ttft_seconds is not None)[len(recorded) // 2]),))
    classified = [dataclasses.replace(r) for r in recorded]
    for r in classified:
        classify_record(r, classes, lambda key: None)
    calibration = calibrate(classified, PRICES)
    n = len(calibration.requests)
    good = sum(req.slo_outcome == OUTCOME_MET for req in calibration.requests)
    assert 0 < good < n and any(r.slo_outcome == OUTCOME_MISSED for r in classified)
    for scenario in (Scenario(), Scenario(gpu_utilization=0.8),
                     Scenario(spec_decode_speedup=2.0)):
        p = project(calibration, scenario)
        assert p.goodput_per_gpu == pytest.approx(p.requests_per_second_per_gpu * good / n)
        assert p.dollars_per_good_request == pytest.approx(p.cost_dollars / good)
    result = what_if(classified, PRICES, Scenario(spec_decode_speedup=2.0))
    # faster decode: the same good requests on fewer GPU-seconds and dollars
    assert result["change"]["dollars_per_good_request"] < 0
    assert result["change"]["goodput_per_gpu"] > 0
    assert result["change"]["goodput_per_gpu"] == pytest.approx(
        result["change"]["requests_per_second_per_gpu"])  # outcomes held as recorded
