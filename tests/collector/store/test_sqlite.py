"""The SQLite store: batching, reading back, retention, restart."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from tokenpath.collector.stats import CollectorStats
from tokenpath.collector.store import RecordStore, StoreConfig
from tokenpath.records import IdleCost, PhaseShare, RequestRecord, StageTiming
from tokenpath.stages import Phase, Provenance, StageId


def record(i: int, end: float) -> RequestRecord:
    r = RequestRecord(trace_id=format(i, "032x"), model="m", start_unix=end - 1, end_unix=end,
                      input_tokens=i, prefix_fingerprints=("ab12",))
    t = StageTiming(StageId.KERNEL_EXEC, 0.5, Provenance.MODELED, 0.01)
    t.phases[Phase.PREFILL] = PhaseShare(0.5, 0.01)
    r.stages[StageId.KERNEL_EXEC] = t
    return r


def test_round_trip_and_restart(tmp_path: Path) -> None:
    path = str(tmp_path / "s.db")
    now = 1_000_000.0  # the writer thread applies retention against this clock
    store = RecordStore(StoreConfig(path=path), clock=lambda: now)
    store.start()
    for i in range(1, 21):
        store.consume_record(record(i, now - 100 + i))
    store.consume_idle_cost(IdleCost("pool-a", now - 10, now, 0.25))
    store.shutdown()
    store.shutdown()  # idempotent

    reopened = RecordStore(StoreConfig(path=path), clock=lambda: now)
    newest = reopened.records(limit=3)
    assert [r.input_tokens for r in newest] == [20, 19, 18]
    assert reopened.count() == 20
    assert reopened.record(format(7, "032x")) == record(7, now - 93)
    assert reopened.idle_cost_dollars() == 0.25
    assert len(reopened.records(since_unix=now - 85)) == 6
    reopened.shutdown()


def test_same_trace_twice_is_one_row(tmp_path: Path) -> None:
    store = RecordStore(StoreConfig(path=str(tmp_path / "s.db")))
    store.consume_record(record(1, 10.0))
    store.consume_record(record(1, 10.0))
    assert store.count() == 1
    store.shutdown()


def test_retention_deletes_old_rows(tmp_path: Path) -> None:
    store = RecordStore(StoreConfig(path=str(tmp_path / "s.db"), retention_seconds=100.0),
                        clock=lambda: 1000.0)
    store.consume_record(record(1, 850.0))
    store.consume_record(record(2, 950.0))
    assert store.apply_retention() == 1
    assert [r.input_tokens for r in store.records()] == [2]
    store.shutdown()


def test_a_non_finite_figure_is_stored_as_null_and_the_record_still_reads(
        tmp_path: Path) -> None:
    # No record should hold NaN or infinity; if one does, its row is valid JSON and the
    # record reads back (the figure as 0) instead of failing every listing.
    store = RecordStore(StoreConfig(path=str(tmp_path / "s.db")))
    broken = record(1, 10.0)
    broken.cost_dollars = float("nan")
    broken.stages[StageId.KERNEL_EXEC].seconds = float("inf")
    broken.ttft_seconds = float("nan")
    store.consume_record(broken)
    (read,) = store.records()
    assert read.cost_dollars == 0.0
    assert read.stages[StageId.KERNEL_EXEC].seconds == 0.0
    assert read.ttft_seconds is None
    assert read.input_tokens == 1
    store.shutdown()


def test_the_writer_applies_retention_on_its_own_schedule(tmp_path: Path) -> None:
    # The writer sleeps until a record arrives or the next retention pass is due.
    clock = [1000.0]
    store = RecordStore(StoreConfig(path=str(tmp_path / "s.db"), retention_seconds=100.0,
                                    retention_check_seconds=0.05), clock=lambda: clock[0])
    store.start()
    try:
        store.consume_record(record(1, 950.0))
        deadline = time.monotonic() + 10
        while store.count() < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.count() == 1
        clock[0] = 1060.0  # the record is now past retention
        while store.count() > 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.count() == 0
    finally:
        store.shutdown()


def test_a_count_past_64_bits_is_stored_and_the_writer_goes_on(tmp_path: Path) -> None:
    # orjson refuses integers past 64 bits; such a row is written by the stdlib encoder.
    store = RecordStore(StoreConfig(path=str(tmp_path / "s.db")))
    store.start()
    try:
        huge = record(1, 10.0)
        huge.input_tokens = 10**20
        store.consume_record(huge)
        store.consume_record(record(2, 11.0))
        deadline = time.monotonic() + 10
        while store.count() < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(r.input_tokens for r in store.records()) == [2, 10**20]
    finally:
        store.shutdown()


def test_a_record_that_cannot_be_encoded_loses_only_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenpath.collector.store import sqlite as store_module

    real_encode = store_module.encode_row

    def encode(encoder: Any, db: Any, r: RequestRecord) -> list[Any]:
        if r.input_tokens == 2:
            raise ValueError("unencodable")
        return real_encode(encoder, db, r)

    monkeypatch.setattr(store_module, "encode_row", encode)
    stats = CollectorStats()
    store = RecordStore(StoreConfig(path=str(tmp_path / "s.db")), stats)
    store.start()
    for i in (1, 2, 3):
        store.consume_record(record(i, 10.0 + i))
    store.shutdown()
    assert sorted(r.input_tokens for r in RecordStore(
        StoreConfig(path=str(tmp_path / "s.db"))).records()) == [1, 3]
    assert stats.store_errors.value == 1


def test_an_idle_slice_that_is_not_finite_loses_only_itself(tmp_path: Path) -> None:
    stats = CollectorStats()
    store = RecordStore(StoreConfig(path=str(tmp_path / "s.db")), stats)
    store.start()
    store.consume_record(record(1, 11.0))
    store.consume_idle_cost(IdleCost("pool-a", 10.0, 11.0, float("nan")))
    store.consume_idle_cost(IdleCost("pool-a", 11.0, 12.0, 0.25))
    store.consume_record(record(2, 12.0))
    store.shutdown()
    reopened = RecordStore(StoreConfig(path=str(tmp_path / "s.db")))
    assert sorted(r.input_tokens for r in reopened.records()) == [1, 2]
    assert reopened.idle_cost_dollars() == 0.25
    assert stats.store_errors.value == 1


def test_a_joined_record_is_found_from_the_client_trace_it_joined(tmp_path: Path) -> None:
    store = RecordStore(StoreConfig(path=str(tmp_path / "s.db")))
    joined = record(1, 10.0)
    workflow = format(99, "032x")
    joined.joined_trace_ids = (workflow,)
    store.consume_record(joined)
    store.consume_record(record(2, 11.0))
    assert [r.record_id for r in store.records_of_trace(workflow)] == [joined.record_id]
    assert store.record(workflow) == joined
    assert store.records_of_trace(format(98, "032x")) == []
    store.shutdown()


def test_a_reader_opens_the_store_read_only_and_changes_nothing(tmp_path: Path) -> None:
    import hashlib

    from tokenpath.collector.store.factory import open_store_readonly

    path = tmp_path / "s.db"
    writer = RecordStore(StoreConfig(path=str(path)))
    writer.consume_record(record(1, 100.0))
    writer.consume_idle_cost(IdleCost("p", 0.0, 1.0, 0.5, 7.0))
    writer.shutdown()
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    reader = open_store_readonly(str(path))
    try:
        assert [r.trace_id for r in reader.records()] == [record(1, 100.0).trace_id]
        assert reader.idle_energy_joules() == 7.0
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            reader._db.execute("DELETE FROM records")
    finally:
        reader.shutdown()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def test_a_store_written_before_the_slo_columns_gains_them_at_open(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = RecordStore(StoreConfig(path=str(path)))
    store.consume_record(record(1, 100.0))
    store.shutdown()
    db = sqlite3.connect(path)  # the layout as it was before the SLO fields
    for column in ("slo", "slo_outcome", "slo_miss_stage"):
        db.execute(f"ALTER TABLE records DROP COLUMN {column}")
    db.commit()
    db.close()

    reopened = RecordStore(StoreConfig(path=str(path)))
    classified = record(2, 101.0)
    classified.slo, classified.slo_outcome, classified.slo_miss_stage = (
        "interactive", "missed", "prefill")
    reopened.consume_record(classified)
    reopened.shutdown()
    again = RecordStore(StoreConfig(path=str(path)))
    try:
        assert again.record(format(1, "032x")) == record(1, 100.0)  # NULL: no class
        assert again.record(format(2, "032x")) == classified
    finally:
        again.shutdown()


def test_a_reader_of_a_store_written_before_the_slo_columns_reads_it_unchanged(
        tmp_path: Path) -> None:
    import hashlib

    from tokenpath import views
    from tokenpath.collector.store.factory import open_store_readonly
    from tokenpath.query import Window

    path = tmp_path / "s.db"
    store = RecordStore(StoreConfig(path=str(path)))
    long_context = record(1, 100.0)
    long_context.input_tokens = 20_000  # read through the long-context measures too
    store.consume_record(long_context)
    store.consume_record(record(2, 101.0))
    store.shutdown()
    db = sqlite3.connect(path)
    for column in ("slo", "slo_outcome", "slo_miss_stage"):
        db.execute(f"ALTER TABLE records DROP COLUMN {column}")
    db.commit()
    db.close()
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    reader = open_store_readonly(str(path))
    try:
        assert [r.slo for r in reader.records()] == [None, None]
        report = views.report_view(reader, Window())
        assert report.requests == 2 and report.slo is None
        assert views.leaks_view(reader, Window())  # last_doubling reads the same records
    finally:
        reader.shutdown()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
