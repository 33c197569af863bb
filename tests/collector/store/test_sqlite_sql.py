"""The store's queries (collector/store/sqlite_sql.py): a window's rolled-up periods and the rows
read from records never overlap and miss nothing, through retention and rebuilds."""

from __future__ import annotations

import math
import random
import sqlite3
from pathlib import Path

import pytest

from bench.store_workload import synthetic_records
from testkit.oracles.report import build_report
from tokenpath import views
from tokenpath.collector.store import RecordStore, StoreConfig
from tokenpath.collector.store import sqlite_sql as store_sql
from tokenpath.query import Window
from tokenpath.records import RequestRecord

END = 1_700_000_000.0 + 777.25


def _store(path: Path, records: list[RequestRecord], retention: float = 30 * 86400.0,
           clock: float = END) -> RecordStore:
    store = RecordStore(StoreConfig(path=str(path), retention_seconds=retention),
                        clock=lambda: clock)
    store._rolled_at = -math.inf  # every batch completes a rollup run
    for i in range(0, len(records), 300):
        store._write(records[i:i + 300])
        store._rolled_at = -math.inf
    return store


def test_every_window_counts_each_record_once(tmp_path: Path) -> None:
    records = list(synthetic_records(1500, END, span_seconds=3 * 3600.0, seed=4))
    store = _store(tmp_path / "s.db", records[:1200])
    store._rolled_at = math.inf  # the last ones stay past the watermark
    store._write(records[1200:])
    ends = [r.end_unix for r in records]
    rng = random.Random(1)
    try:
        for _ in range(60):
            a, b = sorted(rng.uniform(END - 4 * 3600, END + 60) for _ in range(2))
            since = None if rng.random() < 0.1 else a
            until = None if rng.random() < 0.3 else b
            if rng.random() < 0.2 and since is not None:  # on a period's edge
                since = (since // store_sql.ROLLUP_SECONDS) * store_sql.ROLLUP_SECONDS
            expected = sum(1 for e in ends if (since is None or e >= since)
                           and (until is None or e <= until))
            (got,) = store.aggregate(Window(since, until), ["n"]).values() or [None]
            assert (0 if got is None else got.count("n")) == expected, (since, until)
    finally:
        store.shutdown()


def test_retention_through_a_period_keeps_the_views_exact(tmp_path: Path) -> None:
    records = list(synthetic_records(1200, END, span_seconds=2 * 3600.0, seed=6))
    store = _store(tmp_path / "s.db", records, retention=3600.0 + 123.0)
    try:
        deleted = store.apply_retention()
        kept = store.records()
        assert deleted > 0 and len(kept) == len(records) - deleted
        reference = build_report(kept, store.idle_cost_dollars(), store.idle_energy_joules())
        got = views.report_view(store, Window()).to_json()
        want = reference.to_json()
        assert got["requests"] == want["requests"]
        assert got["cost_dollars"] == pytest.approx(want["cost_dollars"], rel=1e-9)
        assert got["input_tokens"] == want["input_tokens"]
    finally:
        store.shutdown()


def test_rollups_another_version_wrote_are_rebuilt_at_open(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "s.db"
    records = list(synthetic_records(600, END, span_seconds=3600.0, seed=8))
    _store(path, records).shutdown()
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("UPDATE meta SET value = 'older' WHERE key = 'rollup'")
    db.execute("DELETE FROM rollup")
    db.close()
    with caplog.at_level("INFO"):
        store = RecordStore(StoreConfig(path=str(path), retention_seconds=30 * 86400.0))
    assert "rebuilding them" in caplog.text
    try:
        (totals,) = store.aggregate(Window(), ["n", "cost"]).values()
        assert totals.count("n") == 600
        assert totals["cost"] == pytest.approx(sum(r.cost_dollars for r in records), rel=1e-9)
        assert store.queries._rollup_state()[0] is not None
    finally:
        store.shutdown()


def test_a_commit_between_a_reads_statements_is_not_counted_twice(tmp_path: Path) -> None:
    """A reader's aggregate reads the rollups' watermark, the records past it, then the
    rollups, in separate statements; the collector's writer commits on its own connection
    whenever it likes. The writer here commits a batch (records and their rollups) just as
    the reader starts on the records past the watermark: the reader still answers one
    state of the file, before the batch or after it, never the batch twice."""
    path = tmp_path / "s.db"
    records = list(synthetic_records(900, END, span_seconds=3 * 3600.0, seed=9))
    writer = _store(path, records[:600])
    reader = RecordStore(StoreConfig(path=str(path), read_only=True))
    fired: list[str] = []

    def commit_a_batch_meanwhile(statement: str) -> None:
        if not fired and "FROM records" in statement and "rid > " in statement:
            fired.append(statement)
            writer._rolled_at = -math.inf
            writer._write(records[600:])

    try:
        reader.queries._db.set_trace_callback(commit_a_batch_meanwhile)
        (got,) = reader.aggregate(Window(), ["n"]).values()
        reader.queries._db.set_trace_callback(None)
        assert fired, "the reader never read the records past the rollups' watermark"
        assert got.count("n") in (600, 900)
        (after,) = reader.aggregate(Window(), ["n"]).values()
        assert after.count("n") == 900
    finally:
        reader.shutdown()
        writer.shutdown()
