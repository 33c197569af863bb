"""The gateway benchmark's side-by-side machinery runs end to end (its figures are
`make bench`'s), and `make bench` runs a bench in an interpreter of its own."""

from __future__ import annotations

from rich.console import Console

from bench import stage_recording
from bench.__main__ import _run_one


def test_every_variant_serves_and_its_own_threads_account_for_the_cpu() -> None:
    result = stage_recording.bench_gateway_throughput(seconds_per_round=0.5, rounds=2,
                                                      concurrency=2)
    for variant in ("instrumented", "plain", "uninstrumented_path", "otel_fastapi"):
        assert result[f"{variant}_requests_per_cpu_second"] > 0
    assert len(result["round_ratios"]) == 2
    assert result["requests_per_round"] > 0
    # The variants' threads (found by their CPU clocks) used the CPU this process spent
    # while they served: a wrong thread would leave most of it unattributed.
    assert result["unattributed_cpu_share"] < 0.5
    assert result["ratio"] == (result["instrumented_requests_per_cpu_second"]
                               / result["plain_requests_per_cpu_second"])


def test_a_bench_runs_in_a_fresh_interpreter_and_reports_its_result() -> None:
    result = _run_one("memory", Console(quiet=True))
    assert "error" not in result
    assert result["bytes_per_buffered_span"] > 0
    assert result["_seconds"] >= 0
