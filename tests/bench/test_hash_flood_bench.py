"""bench/hash_flood.py: the figure and what is measured beside it are in its result (a
small run; the bench itself decides nothing by time here)."""

from __future__ import annotations

import pytest

from bench.__main__ import BENCHES, TARGETS
from tokenpath.collector.receivers import otlp_decode


def test_a_small_run_reports_every_figure_the_table_reads() -> None:
    if otlp_decode._native is None:
        pytest.skip("the native decoder is not built")
    from bench.hash_flood import run

    module, function, _ = BENCHES["hash_flood"]
    assert (module, function) == ("bench.hash_flood", "run")
    result = {"hash_flood": run(spans=2000, rounds=1)}
    targets = [t for t in TARGETS if t.bench == "hash_flood"]
    assert targets
    for target in targets:
        assert target.value(result) is not None, target.label
        for _, path, _ in target.beside:
            assert target.value(result, path) is not None, path
    native = otlp_decode._native
    for name in ("random", "colliding", "sequential"):
        assert result["hash_flood"][f"longest_probe_{name}"] <= native.PROBE_LIMIT
