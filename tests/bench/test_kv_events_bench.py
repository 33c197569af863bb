"""bench/kv_events.py: a small run reports every figure the table reads (nothing is
decided by time here)."""

from __future__ import annotations

from bench.__main__ import BENCHES, TARGETS
from bench.kv_events import run


def test_a_small_run_reports_every_figure_the_table_reads() -> None:
    module, function, _ = BENCHES["kv_events"]
    assert (module, function) == ("bench.kv_events", "run")
    result = {"kv_events": run(blocks=5_000, batches=50)}
    assert result["kv_events"]["memory"]["resident_blocks"] == 5_000
    targets = [t for t in TARGETS if t.bench == "kv_events"]
    assert len(targets) == 2
    for target in targets:
        assert target.value(result) is not None, target.label
        for _, path, _ in target.beside:
            assert target.value(result, path) is not None, path
