"""Reconstruction quality against a step-level simulation's ground truth (docs/cost-model.md).

The attributor sees only the records (timestamps, token counts), never the step log."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from testkit.fakes.clock import FakeClock
from tokenpath.collector.cost.accuracy import compare_to_ground_truth
from tokenpath.collector.cost.attributor import AttributorConfig, CostAttributor
from tokenpath.collector.cost.prices import load_price_sheet
from tokenpath.collector.cost.stepsim import random_workload, simulate
from tokenpath.roofline import roofline_for

from .helpers import RecordingSink

PRICES = load_price_sheet()


def _attribute(records: list, seed: int) -> list:
    shuffled = list(records)
    random.Random(seed).shuffle(shuffled)  # records finish and arrive out of order
    sink = RecordingSink()
    cost = CostAttributor(sink, PRICES, clock=FakeClock(),
                          config=AttributorConfig(tick_seconds=0))
    for record in shuffled:
        cost.consume_record(record)
    cost.shutdown()
    return sink.records


@pytest.mark.parametrize(("model", "tp", "rps"), [
    ("llama-3.1-8b", 1, 3.0),
    ("llama-3.1-8b", 1, 12.0),
    ("llama-3.1-70b", 4, 3.0),
])
def test_apportioned_cost_matches_ground_truth(model: str, tp: int, rps: float,
                                               tmp_path: Path) -> None:
    roofline = roofline_for("H100-SXM", model, tensor_parallel=tp)
    result = simulate(random_workload(7, 250, rps), roofline,
                      PRICES.gpus["H100-SXM"].dollars_per_second, model=model)
    truth = tmp_path / "truth.jsonl"
    truth.write_text("".join(json.dumps(row) + "\n" for row in result.ground_truth))
    summary = compare_to_ground_truth(_attribute(result.records, 1), truth)
    assert summary["matched"] == 250
    assert summary["median_rel_error"] <= 0.05
    assert summary["median_rel_error"] <= 0.1 * summary["naive_median_rel_error"]


def test_chunked_prefill_stays_within_target_at_moderate_load() -> None:
    roofline = roofline_for("H100-SXM", "llama-3.1-8b")
    result = simulate(random_workload(3, 250, 2.0), roofline,
                      PRICES.gpus["H100-SXM"].dollars_per_second, prefill_chunk_tokens=2048)
    summary = compare_to_ground_truth(_attribute(result.records, 2), result.ground_truth)
    assert summary["median_rel_error"] <= 0.05
    assert summary["median_rel_error"] <= 0.1 * summary["naive_median_rel_error"]


@pytest.mark.parametrize("rps", [3.0, 12.0])
def test_chunked_prefill_with_measured_dispatch_matches_ground_truth(rps: float) -> None:
    """The engine hook's per-phase gpu_dispatch counts each prefill's steps: its chunks."""
    roofline = roofline_for("H100-SXM", "llama-3.1-8b")
    result = simulate(random_workload(4, 250, rps), roofline,
                      PRICES.gpus["H100-SXM"].dollars_per_second, prefill_chunk_tokens=512,
                      record_dispatch=True)
    summary = compare_to_ground_truth(_attribute(result.records, 3), result.ground_truth)
    assert summary["median_rel_error"] <= 0.05
    assert summary["median_rel_error"] <= 0.1 * summary["naive_median_rel_error"]


def test_comparison_skips_incomplete_and_unknown_records() -> None:
    roofline = roofline_for("H100-SXM", "llama-3.1-8b")
    result = simulate(random_workload(5, 20, 1.0), roofline, 0.001)
    records = _attribute(result.records, 0)
    records[0].complete = False
    rows = [r for r in result.ground_truth if r["trace_id"] != records[1].trace_id]
    assert compare_to_ground_truth(records, rows)["matched"] == 18
    with pytest.raises(ValueError):
        compare_to_ground_truth(records, [])


def test_streaming_arrival_with_a_short_delay_keeps_the_median_within_target() -> None:
    """Records arrive one second after their request ended, in end order: the watermark's
    delay adapts to the longest recent arrival lag, so few arrive after their slices
    closed, and those are priced from the closed slices."""
    roofline = roofline_for("H100-SXM", "llama-3.1-8b")
    result = simulate(random_workload(9, 250, 6.0), roofline,
                      PRICES.gpus["H100-SXM"].dollars_per_second)
    clock = FakeClock()
    sink = RecordingSink()
    cost = CostAttributor(sink, PRICES, clock=clock,
                          config=AttributorConfig(tick_seconds=0))
    for record in sorted(result.records, key=lambda r: r.engine_end_unix or 0):
        clock.now = (record.engine_end_unix or 0) + 1.0
        cost.consume_record(record)
    cost.shutdown()
    assert cost.stats.late_records.value < 0.05 * len(result.records)
    summary = compare_to_ground_truth(sink.records, result.ground_truth)
    assert summary["median_rel_error"] <= 0.05
    assert summary["median_rel_error"] <= 0.1 * summary["naive_median_rel_error"]
