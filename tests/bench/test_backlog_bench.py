"""bench/backlog.py: a small run reports every figure the `make bench` table reads, and
the backlog is priced as the same traffic live (the bench decides nothing by time here)."""

from __future__ import annotations

from bench.__main__ import BENCHES, TARGETS
from bench.backlog import run


def test_a_small_run_reports_every_figure_the_table_reads() -> None:
    module, function, _ = BENCHES["backlog"]
    assert (module, function) == ("bench.backlog", "run")
    result = run(requests=200, min_delay_seconds=0.3, max_delay_seconds=2.0)
    targets = [t for t in TARGETS if t.bench == "backlog"]
    assert targets
    for target in targets:
        assert target.value({"backlog": result}) is not None, target.label
        for _, path, _ in target.beside:
            assert target.value({"backlog": result}, path) is not None, path
    assert result["requests"] == result["backlog"]["records"] == result["live"]["records"]
    # a backlog misses its units' windows no more often than the same traffic live (with
    # a lateness this short, a sparse live unit's long requests do: its watermark moves
    # with the wall clock between them)
    assert result["backlog_late_records"] <= result["live_late_records"]
