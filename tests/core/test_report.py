"""Report statistics computed from plain records (no Prometheus)."""

from __future__ import annotations

import pytest

from testkit.oracles.report import build_report, percentile
from tokenpath.records import RequestRecord, StageTiming
from tokenpath.report import token_weighted_hit_ratio
from tokenpath.stages import STAGE_IDS, Provenance, StageId


def rec(i: int, inp: int, cached: int, out: int, ttft: float) -> RequestRecord:
    r = RequestRecord(trace_id=format(i, "032x"), input_tokens=inp, cache_read_tokens=cached,
                      output_tokens=out, ttft_seconds=ttft, start_unix=100.0 + i,
                      end_unix=101.0 + i, cost_dollars=0.001 * i)
    r.stages[StageId.ROUTER] = StageTiming(StageId.ROUTER, 0.001 * i, Provenance.MEASURED)
    r.stages[StageId.HBM_LOAD] = StageTiming(StageId.HBM_LOAD, 0.01, Provenance.MODELED)
    return r


def test_hit_ratio_is_token_weighted_not_a_mean_of_ratios() -> None:
    records = [rec(1, 1000, 900, 1, 0.1), rec(2, 10, 0, 1, 0.1)]
    # Mean of per-request ratios would be 0.45; token-weighted is 900 / 1010.
    assert token_weighted_hit_ratio(records) == pytest.approx(900 / 1010)
    assert token_weighted_hit_ratio([]) is None


def test_percentile_interpolates() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == pytest.approx(2.5)
    assert percentile([5.0], 0.95) == 5.0
    assert percentile([], 0.5) is None


def test_report_lists_all_stages_in_path_order_with_provenance() -> None:
    records = [rec(i, 100, 50, 10, 0.1 * i) for i in range(1, 6)]
    report = build_report(records, idle_cost_dollars=0.5)
    data = report.to_json()
    assert [s["stage"] for s in data["stages"]] == [s.value for s in STAGE_IDS]
    router = next(s for s in data["stages"] if s["stage"] == StageId.ROUTER.value)
    assert router["p50_seconds"] == pytest.approx(0.003)
    assert router["provenance"] == "measured"
    hbm = next(s for s in data["stages"] if s["stage"] == StageId.HBM_LOAD.value)
    assert hbm["provenance"] == "modeled"
    unseen = next(s for s in data["stages"] if s["stage"] == StageId.NVLINK.value)
    assert unseen["provenance"] is None and unseen["requests"] == 0
    assert data["requests"] == 5
    assert data["ttft_p50_seconds"] == pytest.approx(0.3)
    assert data["prefix_cache_hit_ratio"] == pytest.approx(0.5)
    assert data["window_seconds"] == pytest.approx(5.0)
    assert data["output_tokens_per_second"] == pytest.approx(50 / 5.0)
    assert data["cost_per_million_output_tokens"] == pytest.approx((0.015 + 0.5) / 50 * 1e6)
    for key in ("idle_cost_dollars", "cache_miss_waste_dollars", "cost_dollars"):
        assert key in data
