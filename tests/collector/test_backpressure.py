"""Admission and the store's back-pressure (collector/backpressure.py): the receivers
refuse while any stage is past its high-water mark; a full store queue makes its caller
wait, never drops; what is still lost is counted and logged at a bounded rate."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from testkit.fakes.clock import FakeClock
from tests.collector.conftest import wait_for
from tests.collector.store.test_sqlite import record
from tokenpath.collector.backpressure import (
    DROP_STORE_CLOSED,
    Backlog,
    DropLog,
    first_over,
    high_water,
)
from tokenpath.collector.config import CollectorConfig
from tokenpath.collector.limits import IngestLimits
from tokenpath.collector.node_metrics import NodeMetricsState
from tokenpath.collector.receivers.ingest import OtlpIngest, Overloaded, admit
from tokenpath.collector.service import CollectorService
from tokenpath.collector.spans import SpanData
from tokenpath.collector.stats import CollectorStats
from tokenpath.collector.store import RecordStore, StoreConfig
from tokenpath.records import RequestRecord

log = logging.getLogger("tests.backpressure")


class _Level:
    def __init__(self, depth: int = 0) -> None:
        self.depth = depth

    def read(self) -> int:
        return self.depth


class _Spans:
    def consume_spans(self, spans: list[SpanData]) -> dict[str, int]:
        return {}


# --- the admission decision ----------------------------------------------------------------


def test_high_water_is_half_the_queue_and_at_least_one() -> None:
    assert high_water(64) == 32
    assert high_water(1) == 1
    assert high_water(3) == 1


def test_admission_refuses_at_the_high_water_mark_and_names_the_backlog() -> None:
    store = _Level(31)
    backlogs = [Backlog("pipeline queue", _Level(0).read, 10),
                Backlog("store queue", store.read, 32)]
    assert first_over(backlogs) is None
    admit(backlogs)  # below every mark: admitted
    store.depth = 32
    assert first_over(backlogs) is backlogs[1]
    with pytest.raises(Overloaded) as err:
        admit(backlogs)
    assert err.value.retry_after > 0
    assert "store queue at 32 (high-water mark 32)" in str(err.value)
    store.depth = 31
    admit(backlogs)  # drained below the mark: admitted again


def test_traces_wait_on_every_backlog_forwarded_records_on_the_record_backlogs() -> None:
    spans, records = _Level(), _Level()
    ingest = OtlpIngest(_Spans(), NodeMetricsState(), IngestLimits(), CollectorStats(),
                        span_backlogs=[Backlog("assembler buffered spans", spans.read, 100)],
                        record_backlogs=[Backlog("store queue", records.read, 5)])
    ingest.admit_traces()
    ingest.admit_logs()
    spans.depth = 100  # the assembler is full: traces refused, records still taken
    with pytest.raises(Overloaded, match="assembler buffered spans"):
        ingest.admit_traces()
    ingest.admit_logs()
    spans.depth, records.depth = 0, 5  # the store is behind: both refused
    with pytest.raises(Overloaded, match="store queue"):
        ingest.admit_traces()
    with pytest.raises(Overloaded, match="store queue"):
        ingest.admit_logs()


def test_the_service_admits_on_the_assembler_pipeline_and_store(tmp_path: Path) -> None:
    service = CollectorService(CollectorConfig(
        http_port=0, grpc_port=None, store_path=str(tmp_path / "s.db"),
        max_buffered_spans=7, pipeline_shed_at=5, store_queue_size=4))
    try:
        ingest = service.ingest
        names = [(b.name, b.high_water) for b in ingest.trace_backlogs]
        assert names == [("assembler buffered spans", 7), ("pipeline queue", 5),
                         ("store queue", 2)]
        assert [b.name for b in ingest.record_backlogs] == ["pipeline queue", "store queue"]
    finally:
        service.store.shutdown()


def test_a_forwarding_service_admits_on_the_forwarder_queue_too(tmp_path: Path) -> None:
    service = CollectorService(CollectorConfig(
        http_port=0, grpc_port=None, store_path=str(tmp_path / "s.db"),
        forward_records="http://127.0.0.1:9/v1/logs"))
    try:
        assert [b.name for b in service.ingest.record_backlogs] == [
            "pipeline queue", "store queue", "forwarder queue"]
    finally:
        assert service.forwarder is not None
        service.forwarder.shutdown()
        service.store.shutdown()


# --- the store's back-pressure -------------------------------------------------------------


def test_a_full_store_queue_makes_the_caller_wait_and_drops_nothing(tmp_path: Path) -> None:
    stats = CollectorStats()
    store = RecordStore(StoreConfig(path=str(tmp_path / "s.db"), queue_size=2, batch_size=1),
                        stats)
    store.start()
    backlog = store.backlog()
    assert backlog.high_water == 1
    with store._db_lock:  # the writer stalls in its first write (a slow disk)
        done = threading.Event()

        def produce() -> None:
            for i in range(1, 11):
                store.consume_record(record(i, 100.0 + i))
            done.set()

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        # the queue full behind the stalled writer: the producer, with records left to
        # put, waits in the store (no drop, no error)
        wait_for(lambda: store.queue_depth == 2)
        assert backlog.over()
        assert producer.is_alive() and not done.is_set()
        assert stats.records_dropped.total() == 0
    assert done.wait(30)
    producer.join()
    wait_for(lambda: store.count() == 10)
    assert not backlog.over()
    store.shutdown()
    assert stats.records_dropped.total() == 0
    assert stats.store_errors.value == 0


def test_a_record_after_shutdown_is_counted_as_dropped(tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    stats = CollectorStats()
    store = RecordStore(StoreConfig(path=str(tmp_path / "s.db")), stats)
    store.start()
    store.shutdown()
    with caplog.at_level(logging.WARNING, logger="tokenpath.collector.store"):
        for i in range(100):
            store.consume_record(record(i, 10.0))
    assert stats.records_dropped[DROP_STORE_CLOSED] == 100
    assert len(caplog.records) == 1  # once, not per record


def test_a_batch_the_writer_fails_on_is_counted_and_the_writer_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stats = CollectorStats()
    store = RecordStore(StoreConfig(path=str(tmp_path / "s.db"), queue_size=1, batch_size=1),
                        stats)
    real_insert = store._insert_records
    failed = []

    def insert(db: Any, records: list[RequestRecord]) -> int:
        if not failed:  # a bug, not the database: the first batch raises
            failed.append(records)
            raise RuntimeError("a bug")
        return real_insert(db, records)

    monkeypatch.setattr(store, "_insert_records", insert)
    store.start()
    for i in range(1, 6):
        store.consume_record(record(i, 10.0 + i))
    assert store.flush(timeout=30)
    store.shutdown()
    reopened = RecordStore(StoreConfig(path=str(tmp_path / "s.db")))
    assert reopened.count() == 4
    reopened.shutdown()
    assert stats.store_errors.value == 1
    assert stats.records_dropped.total() == 0


# --- the bounded-rate drop log -------------------------------------------------------------


def test_drops_are_counted_each_and_logged_at_most_once_per_interval(
        caplog: pytest.LogCaptureFixture) -> None:
    stats = CollectorStats()
    clock = FakeClock(1000.0)
    drops = DropLog(stats, log, "store", every_seconds=10.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger=log.name):
        for _ in range(1000):
            drops.drop("store_closed")
            clock.now += 0.001  # 1000 drops in one second
        assert len(caplog.records) == 1  # the first, at once
        assert "1 records dropped (store_closed: 1)" in caplog.records[0].getMessage()
        clock.now = 1010.0  # ten seconds after the first line
        drops.drop("other", 5)
        assert len(caplog.records) == 2
        assert "1004 records dropped (other: 5, store_closed: 999)" in (
            caplog.records[1].getMessage())
        drops.drop("store_closed", 2)  # within the interval again: held back...
        assert len(caplog.records) == 2
        drops.flush()  # ...until shutdown flushes it
        assert len(caplog.records) == 3
        assert "2 records dropped (store_closed: 2)" in caplog.records[2].getMessage()
        drops.flush()  # nothing since: no line
        assert len(caplog.records) == 3
    assert stats.records_dropped == {"store_closed": 1002, "other": 5}
