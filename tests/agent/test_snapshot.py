"""Snapshot: series recorded as rows are built once, on the first read, by any thread."""

from __future__ import annotations

import threading

from tokenpath import metric_names as mn
from tokenpath.agent.snapshot import Points, Snapshot


def test_deferred_series_are_built_once_whichever_thread_reads_first() -> None:
    builds: list[int] = []
    started = threading.Barrier(8)

    def fill(points: Points) -> None:
        builds.append(1)
        series = points.setdefault(mn.GPU_UTILIZATION, {})
        series[("0",)] = series.get(("0",), 0.0) + 0.5

    snapshot = Snapshot(1, {mn.AGENT_NVML_UP: {(): 1.0}}, [fill])
    seen: list[float | None] = []

    def reader() -> None:
        started.wait()
        seen.append(snapshot.get(mn.GPU_UTILIZATION, ("0",)))

    threads = [threading.Thread(target=reader) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert builds == [1]
    assert seen == [0.5] * 8
    assert snapshot.get(mn.AGENT_NVML_UP) == 1.0
    assert snapshot.series_count() == 2


def test_a_snapshot_nobody_reads_never_builds_its_series() -> None:
    builds: list[int] = []
    Snapshot(1, {}, [lambda points: builds.append(1)])
    assert builds == []


def test_a_failing_fill_loses_its_own_series_only() -> None:
    def broken(points: Points) -> None:
        raise ValueError("bad row")

    def fine(points: Points) -> None:
        points[mn.GPU_UTILIZATION] = {("0",): 0.5}

    snapshot = Snapshot(1, {}, [broken, fine])
    assert snapshot.get(mn.GPU_UTILIZATION, ("0",)) == 0.5
    assert snapshot.get(mn.GPU_UTILIZATION, ("0",)) == 0.5  # read again: no new error
