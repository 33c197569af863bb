"""The gateway benchmark's side-by-side machinery runs end to end (its figures are
`make bench`'s), and `make bench`'s runner reads a child's result."""

from __future__ import annotations

import pytest
from rich.console import Console

from bench import stage_recording
from bench.__main__ import _run_one


def test_every_variant_serves_side_by_side_in_its_own_process() -> None:
    result = stage_recording.bench_gateway_throughput(seconds_per_round=0.5, rounds=2,
                                                      concurrency=2)
    for variant in stage_recording.GATEWAY_VARIANTS:
        assert result[f"{variant}_requests_per_cpu_second"] > 0
    assert len(result["round_ratios"]) == 2
    assert result["requests_per_round"] > 0
    for variant in stage_recording.GATEWAY_VARIANTS:  # each server's garbage collector
        summary = result["garbage_collector"][variant]
        assert summary["process_cpu_seconds"] > 0
        assert 0 <= summary["gc_cpu_seconds"] <= summary["process_cpu_seconds"]
    assert result["instrumented_gc_percent_of_cpu"] is not None
    # the variants that export did post their spans over OTLP/HTTP to the bench's sink
    exporting = (stage_recording.INSTRUMENTED, stage_recording.PLAIN,
                 stage_recording.INSTRUMENTED_STOCK_EXPORT, stage_recording.PLAIN_STOCK_EXPORT)
    assert set(result["export_requests"]) == set(exporting)
    assert all(result["export_bytes"][variant] > 0 for variant in exporting)


def test_the_gc_clock_counts_a_collection_and_its_time() -> None:
    import gc

    clock = stage_recording.GcClock()
    was_enabled = gc.isenabled()
    gc.disable()  # no automatic collection besides the one asked for
    gc.callbacks.append(clock)
    try:
        gc.collect(1)
    finally:
        gc.callbacks.remove(clock)
        if was_enabled:
            gc.enable()
    summary = clock.summary()
    assert summary["collections_by_generation"] == [0, 1, 0]
    assert summary["gc_cpu_seconds"] == clock.seconds
    assert summary["gc_share_of_cpu"] == pytest.approx(
        clock.seconds / summary["process_cpu_seconds"])


def test_make_bench_runs_a_bench_as_a_child_process_and_reads_its_result() -> None:
    result = _run_one("memory", Console(quiet=True))
    assert "error" not in result
    assert result["bytes_per_buffered_span"] > 0
    assert result["_seconds"] >= 0
