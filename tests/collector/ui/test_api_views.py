"""The UI's read-only views: stages, and the time series and leaks (tokenpath/views.py, over
the records loaded into a store), the what-if."""

from __future__ import annotations

from typing import Any

import pytest

from tokenpath import views
from tokenpath.collector import api_views
from tokenpath.collector.cost.prices import load_price_sheet
from tokenpath.collector.cost.whatif import Scenario, what_if
from tokenpath.collector.whatif_view import WhatIfRequest, whatif_view
from tokenpath.config import ConfigError
from tokenpath.leaks import context_bucket_labels
from tokenpath.query import Window
from tokenpath.records import PhaseShare, RequestRecord, StageTiming
from tokenpath.stages import STAGES, Phase, Provenance, StageId


def _record(i: int, *, start: float, input_tokens: int = 1000, cached: int = 0,
            output: int = 100, fingerprints: tuple[str, ...] = (), waste: float = 0.0,
            cost: float = 0.0, chunks: int = 0, small: int = 0,
            prefill: float = 0.1, decode: float = 0.9, ttft: float = 0.2) -> RequestRecord:
    return RequestRecord(
        trace_id=f"{i:032x}", start_unix=start, end_unix=start + 1.0,
        input_tokens=input_tokens, cache_read_tokens=cached, output_tokens=output,
        prefix_fingerprints=fingerprints, cache_miss_waste_dollars=waste, cost_dollars=cost,
        response_chunks=chunks, small_chunks=small, prefill_seconds=prefill,
        decode_seconds=decode, ttft_seconds=ttft, node="n1", tensor_parallel=1,
    )


def test_stages_view_is_the_stage_table_in_path_order() -> None:
    view = api_views.stages_view()
    assert [s["id"] for s in view] == [s.id.value for s in STAGES]
    assert [s["order"] for s in view] == list(range(1, 16))
    assert {s["id"] for s in view if s["gpu"]} == {
        StageId.GPU_DISPATCH.value, StageId.HBM_LOAD.value, StageId.KERNEL_EXEC.value,
        StageId.NVLINK.value}


def test_timeseries_hit_ratio_is_token_weighted_per_bucket() -> None:
    records = [
        _record(0, start=0.0, input_tokens=100, cached=100),  # ends at 1
        _record(1, start=0.0, input_tokens=900, cached=0),  # ends at 1
        _record(2, start=9.0, input_tokens=10, cached=5),  # ends at 10
    ]
    with views.over_records(records) as queries:
        view = views.timeseries_view(queries, Window(), buckets=3)
    points = view["points"]
    assert len(points) == 3
    assert points[0]["requests"] == 2
    assert points[0]["prefix_cache_hit_ratio"] == pytest.approx(0.1)  # not mean(1, 0) = 0.5
    assert points[1]["requests"] == 0 and points[1]["prefix_cache_hit_ratio"] is None
    assert points[2]["prefix_cache_hit_ratio"] == pytest.approx(0.5)
    with views.over_records([]) as queries:
        assert views.timeseries_view(queries, Window(), buckets=3)["points"] == []


def test_repeated_prefixes_rank_by_waste_and_count_recomputed_tokens() -> None:
    shared = ("a0", "a1", "a2")
    records = [
        _record(0, start=0, input_tokens=100, fingerprints=(*shared, "u0")),  # first sighting
        _record(1, start=1, input_tokens=100, cached=48, fingerprints=(*shared, "u1")),  # hit
        _record(2, start=2, input_tokens=100, cached=0, waste=0.5,
                fingerprints=(*shared, "u2")),  # miss: 48 tokens recomputed
        _record(3, start=3, input_tokens=100, cached=0, waste=2.0,
                fingerprints=("b0", "x")),  # b0 never seen before: not repeated
        _record(4, start=4, input_tokens=100, cached=0, waste=0.25,
                fingerprints=("a0", "y")),  # repeats only the first block
    ]
    with views.over_records(records) as queries:
        cache = views.leaks_view(queries, Window(), limit=10, block_tokens=16)["cache"]
    top, recomputed = cache["top_prefixes"], cache["recomputed_prefix_tokens"]
    assert [p["fingerprint"] for p in top] == ["a2", "a0"]
    deep = top[0]
    assert (deep["prefix_tokens"], deep["requests"], deep["hits"], deep["misses"]) == (48, 2, 1, 1)
    assert deep["recomputed_tokens"] == 48
    assert deep["waste_dollars"] == pytest.approx(0.5)
    assert top[1]["prefix_tokens"] == 16 and top[1]["recomputed_tokens"] == 16
    assert recomputed == 64
    assert "content" not in str(top)


def test_long_context_and_small_packet_shares() -> None:
    records = [
        _record(0, start=0, input_tokens=500, cost=1.0, chunks=100, small=90),
        _record(1, start=1, input_tokens=20_000, cost=3.0, prefill=0.9, chunks=100, small=10),
    ]
    records[0].stages[StageId.RESPONSE_PATH] = StageTiming(StageId.RESPONSE_PATH, 1.0,
                                                           Provenance.MEASURED)
    records[1].stages[StageId.HBM_LOAD] = StageTiming(StageId.HBM_LOAD, 3.0, Provenance.MODELED)
    with views.over_records(records) as queries:
        leaks = views.leaks_view(queries, Window(), long_context_tokens=8192)
    long = leaks["long_context"]
    assert long["share_of_requests"] == pytest.approx(0.5)
    assert long["share_of_cost"] == pytest.approx(0.75)
    assert long["share_of_prefill_seconds"] == pytest.approx(0.9)
    by_label = {b["label"]: b["requests"] for b in long["histogram"]}
    # the context buckets every view shares (tokenpath.leaks): input + output tokens
    assert by_label["0-2048"] == 1 and by_label["8192-32768"] == 1
    assert set(by_label) == set(context_bucket_labels())
    small = leaks["small_packets"]
    assert small["share"] == pytest.approx(0.5)
    assert small["response_path_share_of_latency"] == pytest.approx(0.25)


def _priced(i: int, prefill_cost: float, decode_cost: float, **kw: Any) -> RequestRecord:
    record = _record(i, **kw)
    record.stages[StageId.KERNEL_EXEC] = StageTiming(
        StageId.KERNEL_EXEC, 0.1, Provenance.MODELED, prefill_cost,
        {Phase.PREFILL: PhaseShare(0.1, prefill_cost)})
    record.stages[StageId.HBM_LOAD] = StageTiming(
        StageId.HBM_LOAD, 0.9, Provenance.MODELED, decode_cost,
        {Phase.DECODE: PhaseShare(0.9, decode_cost)})
    record.cost_dollars = prefill_cost + decode_cost
    return record


def test_whatif_view_is_the_roofline_engine() -> None:
    records = [_priced(i, 0.2, 0.8, start=float(i), cached=500) for i in range(10)]
    prices = load_price_sheet(None)
    request = WhatIfRequest(spec_decode_speedup=2.0, quantization="int4")
    out = whatif_view(records, prices, request)
    direct = what_if(records, prices, Scenario(spec_decode_speedup=2.0, quantization="int4"))
    assert out["engine"] == "roofline" and out["modeled"] is True
    assert out["baseline"] == direct["baseline"] and out["projected"] == direct["projected"]
    assert (out["projected"]["cost_per_million_output_tokens"]
            < out["baseline"]["cost_per_million_output_tokens"])


@pytest.mark.parametrize(("body", "key"), [
    ({"spec_decode_speedup": 0.5}, "spec_decode_speedup"),
    ({"cache_hit_rate_delta": "lots"}, "cache_hit_rate_delta"),
    ({"gpu_utilization": 2}, "gpu_utilization"),
    ({"quantization": "fp3"}, "quantization"),
    ({"spec_decode_speedup": True}, "spec_decode_speedup"),
    ({"spec_decode_speedup": 0}, "spec_decode_speedup"),  # a value, not "absent"
    ({"spec_decode_speedup": "nan"}, "spec_decode_speedup"),
])
def test_whatif_request_errors_name_the_key(body: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        WhatIfRequest.from_json(body)
    assert info.value.key == key
