"""SIGKILL mid-stream: every record stored before the kill survives, nothing half-written."""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
from pathlib import Path

import httpx

from testkit.support.otlp import PROTOBUF_HEADERS, export_request, request_span
from testkit.support.processes import collector_process, start_collector
from tokenpath.collector.store.factory import open_store_readonly

FAST = "assembler:\n  root_grace_seconds: 0\n  tick_seconds: 0.02\n"
KILL_AFTER_RECORDS = 60


class _Sender(threading.Thread):
    """Streams export requests of 5 requests each until stopped or the server is gone."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stop = threading.Event()
        self.accepted = 0

    def run(self) -> None:
        with httpx.Client(timeout=2) as client:
            while not self.stop.is_set():
                body = export_request([request_span() for _ in range(5)]).SerializeToString()
                try:
                    response = client.post(f"{self.url}/v1/traces", content=body,
                                           headers=PROTOBUF_HEADERS)
                except httpx.HTTPError:
                    continue
                if response.status_code == 200:
                    self.accepted += 5


class _Reader(threading.Thread):
    """A separate SQLite connection noting every committed record, as another process
    would see it."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.stop = threading.Event()
        self.seen: set[str] = set()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                with sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=1) as db:
                    rows = db.execute("SELECT record_id FROM records").fetchall()
                self.seen.update(trace_id for (trace_id,) in rows)
            except sqlite3.Error:
                pass  # the file may not exist yet, or be busy for a moment
            time.sleep(0.05)


def test_sigkill_mid_stream_keeps_every_committed_record(tmp_path: Path) -> None:
    store = tmp_path / "store.db"
    config = tmp_path / "collector.yaml"
    config.write_text(FAST)
    collector = start_collector(store, "--config", str(config))
    sender, reader = _Sender(collector.http_url), _Reader(store)
    sender.start()
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while len(reader.seen) < KILL_AFTER_RECORDS:
            assert time.monotonic() < deadline, "collector did not store records"
            assert collector.proc.poll() is None
            time.sleep(0.05)
        reader.stop.set()
        reader.join()
        seen_before_kill = set(reader.seen)
        sent_before_kill = sender.accepted
        collector.proc.send_signal(signal.SIGKILL)  # while the sender is still streaming
        collector.proc.wait(timeout=10)
    finally:
        sender.stop.set()
        sender.join(timeout=10)
        collector.stop(signal.SIGKILL)
    assert collector.proc.returncode == -signal.SIGKILL
    assert sender.accepted > sent_before_kill or sent_before_kill > len(seen_before_kill)

    with sqlite3.connect(store) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        (count,) = db.execute("SELECT count(*) FROM records").fetchone()
    db.close()
    reader = open_store_readonly(str(store))
    try:
        stored = {r.trace_id: r for r in reader.records()}  # every row reads whole
    finally:
        reader.shutdown()
    assert len(stored) == count
    assert seen_before_kill <= stored.keys()

    # A new collector opens the same store and serves every record.
    with collector_process(store) as again:
        listed = httpx.get(f"{again.http_url}/api/requests", params={"limit": 10_000},
                           timeout=5).json()
    assert {r["trace_id"] for r in listed} == stored.keys()


def test_200_means_buffered_and_shutdown_writes_it(tmp_path: Path) -> None:
    """The spans are in the assembler's buffer when the 200 arrives (before any record
    exists); shutting down writes them to the store file."""
    from tokenpath.collector.assembler import AssemblerConfig
    from tokenpath.collector.config import CollectorConfig
    from tokenpath.collector.service import CollectorService

    store = tmp_path / "store.db"
    held = AssemblerConfig(root_grace_seconds=600, idle_timeout_seconds=600)
    service = CollectorService(CollectorConfig(http_port=0, grpc_port=None,
                                               store_path=str(store), assembler=held))
    service.start()
    try:
        spans = [request_span() for _ in range(3)]
        response = httpx.post(f"{service.http_url}/v1/traces", headers=PROTOBUF_HEADERS,
                              content=export_request(spans).SerializeToString(), timeout=5)
        assert response.status_code == 200
        assert service.stats.spans_buffered.value == 3
        assert service.store.count() == 0
    finally:
        service.shutdown()
    with sqlite3.connect(store) as db:
        stored = {trace_id for (trace_id,) in db.execute("SELECT record_id FROM records")}
    assert stored == {span.trace_id.hex() for span in spans}
