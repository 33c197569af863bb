"""The embedded store: request records and idle cost, durable across restarts.

SQLite (stdlib, one file, WAL journal): it needs no server and no extra dependency on a
node, and each batch commits in one transaction, so a crash or SIGKILL leaves every
committed record intact and nothing half-written. Records are written in batches by a
writer thread, off the ingest path; old rows are deleted after ``retention_seconds``.
A record's body is its JSON (``RequestRecord.to_json``), encoded with orjson: the stdlib
encoder spent about 46 µs per record on it, orjson about 3 µs (docs/performance.md). A
non-finite float, which no record should hold, is written as ``null`` (valid JSON) and
read back as 0. A record that cannot be encoded at all is counted in ``store_errors`` and
the rest of its batch is written; the writer thread never stops on a bad record.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from tokenpath.collector.backpressure import (
    DROP_STORE_CLOSED,
    Backlog,
    DropLog,
    high_water,
)
from tokenpath.collector.stats import CollectorStats
from tokenpath.config import ConfigError
from tokenpath.pipeline import IdleCost
from tokenpath.records import RequestRecord

log = logging.getLogger(__name__)

DEFAULT_RETENTION_SECONDS = 7 * 86400.0
DEFAULT_BATCH_SIZE = 500
# How often the writer deletes rows past retention. Between batches it sleeps until the
# next record or the next retention pass, so an idle collector's store wakes once a minute.
DEFAULT_RETENTION_CHECK_SECONDS = 60.0
DEFAULT_QUEUE_SIZE = 100_000
# How long a put into a full queue waits before it checks that the writer still runs.
PUT_WAIT_SECONDS = 1.0
MEMORY = ":memory:"

# The requests table's key column, named trace_id in the first schema, holds the record id
# (the trace id itself for a trace with one LLM call, "<trace id>-<span id>" per call of a
# trace with several), so stores written before records were per call read unchanged.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    trace_id TEXT PRIMARY KEY,
    end_unix REAL NOT NULL,
    model TEXT NOT NULL,
    complete INTEGER NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS requests_end ON requests(end_unix);
CREATE TABLE IF NOT EXISTS idle_cost (
    pool TEXT NOT NULL,
    start_unix REAL NOT NULL,
    end_unix REAL NOT NULL,
    dollars REAL NOT NULL,
    energy_joules REAL NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS idle_cost_end ON idle_cost(end_unix);
CREATE TABLE IF NOT EXISTS joined_traces (
    trace_id TEXT NOT NULL,
    record_id TEXT NOT NULL,
    end_unix REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS joined_traces_trace ON joined_traces(trace_id);
"""


def encode_body(record: RequestRecord) -> str:
    """A record's row body: its JSON, by orjson; by the stdlib encoder for what orjson
    refuses (an integer past 64 bits, from a garbled token count)."""
    body = record.to_json()
    try:
        return orjson.dumps(body).decode()
    except TypeError:
        return json.dumps(body, separators=(",", ":"))


def decode_body(body: str | bytes) -> dict[str, Any]:
    """A row body back as JSON; the stdlib reader for what orjson refuses (``NaN``, which
    rows written by earlier versions may hold)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = json.loads(body)
    if not isinstance(data, dict):
        raise ValueError("store row body is not a JSON object")
    return data


@dataclass(frozen=True, slots=True)
class StoreConfig:
    path: str = MEMORY
    retention_seconds: float = DEFAULT_RETENTION_SECONDS
    batch_size: int = DEFAULT_BATCH_SIZE
    retention_check_seconds: float = DEFAULT_RETENTION_CHECK_SECONDS
    queue_size: int = DEFAULT_QUEUE_SIZE
    read_only: bool = False  # a reader (CLI): the file is opened read-only, never changed

    def validate(self) -> None:
        if self.retention_seconds <= 0:
            raise ConfigError("store.retention_seconds", "must be > 0")
        if self.batch_size < 1:
            raise ConfigError("store.batch_size", "must be >= 1")
        every = self.retention_check_seconds
        if not (every > 0 and math.isfinite(every)):
            raise ConfigError("store.retention_check_seconds", "must be a finite number > 0")
        if self.queue_size < 1:
            raise ConfigError("store.queue_size", "must be >= 1")
        if self.path != MEMORY:
            parent = Path(self.path).expanduser().resolve().parent
            if not parent.is_dir():
                raise ConfigError("store.path", f"folder {parent} does not exist")


_Item = RequestRecord | IdleCost


class RecordStore:
    """A sink that writes records in batches, and the reader the API and CLI use."""

    def __init__(
        self,
        config: StoreConfig | None = None,
        stats: CollectorStats | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config or StoreConfig()
        self._config.validate()
        self._stats = stats or CollectorStats()
        self._clock = clock
        # Bounded: a put waits while it is full (back-pressure), never drops (_put).
        self._queue: queue.Queue[_Item | None] = queue.Queue(self._config.queue_size)
        self._drops = DropLog(self._stats, log, "store")
        self._writer_gone = False
        self._db_lock = threading.Lock()
        self._db = self._connect()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._last_retention = 0.0

    def _connect(self) -> sqlite3.Connection:
        path = self._config.path
        if path != MEMORY:
            path = str(Path(path).expanduser())
        if self._config.read_only and path != MEMORY:
            uri = Path(path).resolve().as_uri() + "?mode=ro"
            return sqlite3.connect(uri, uri=True, check_same_thread=False,
                                   isolation_level=None)
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        if path != MEMORY:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(_SCHEMA)
        columns = {row[1] for row in db.execute("PRAGMA table_info(idle_cost)")}
        if "energy_joules" not in columns:  # a store written before energy was kept
            db.execute("ALTER TABLE idle_cost ADD COLUMN energy_joules REAL NOT NULL DEFAULT 0")
        return db

    # --- sink ------------------------------------------------------------------------------

    def consume_record(self, record: RequestRecord) -> None:
        self._put(record)

    def consume_idle_cost(self, idle: IdleCost) -> None:
        self._put(idle)

    def _put(self, item: _Item) -> None:
        """Queue one item for the writer. Never drops for want of room: while the queue is
        full the caller (the pipeline worker) waits, which is the store's back-pressure;
        the receivers see the backlog (:meth:`backlog`, then the worker's queue) and
        refuse new data meanwhile (collector/backpressure.py)."""
        if self._closed:
            self._drops.drop(DROP_STORE_CLOSED)
            return
        writer = self._thread
        if writer is None:  # not started: write synchronously (tests, one-shot tools)
            self._write([item])
            return
        while writer.is_alive():
            try:
                self._queue.put(item, timeout=PUT_WAIT_SECONDS)
                return
            except queue.Full:
                continue  # the writer is behind: wait on, while it runs
        # The writer died (a bug): write here what it left, and this item, rather than lose them.
        if not self._writer_gone:
            self._writer_gone = True
            log.error("store: the writer thread is gone; records are written on the caller's")
        self.flush()
        self._write([item])

    @property
    def queue_depth(self) -> int:
        """Items waiting for the writer."""
        return self._queue.qsize()

    def backlog(self) -> Backlog:
        """The write queue as admission sees it: past half of ``queue_size`` the
        receivers shed load."""
        return Backlog("store queue", self._queue.qsize, high_water(self._config.queue_size))

    def start(self) -> None:
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._run, name="tokenpath-store",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            every = self._config.retention_check_seconds
            wait = self._last_retention + every - self._clock()
            try:
                first = self._queue.get(timeout=min(every, max(0.0, wait)))
            except queue.Empty:
                self._maybe_apply_retention()
                continue
            if first is None:
                self.flush()
                return
            batch: list[_Item] = [first]
            stop = False
            while len(batch) < self._config.batch_size:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            self._write(batch)
            if stop:
                self.flush()
                return
            self._maybe_apply_retention()

    def flush(self) -> None:
        """Write everything queued now, in one transaction."""
        batch: list[_Item] = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                batch.append(item)
        if batch:
            self._write(batch)

    def _write(self, batch: list[_Item]) -> None:
        records = [i for i in batch if isinstance(i, RequestRecord)]
        idle = []
        for i in batch:
            if not isinstance(i, IdleCost):
                continue
            if math.isfinite(i.dollars) and math.isfinite(i.start_unix) and math.isfinite(
                    i.end_unix):
                idle.append(i)
            else:  # loses this slice only, not the batch it came in
                log.error("store: idle cost slice of pool %s is not finite", i.pool)
                self._stats.store_errors.inc()
        rows = []
        for r in records:
            try:
                rows.append((r.record_id, r.end_unix, r.model, int(r.complete), encode_body(r)))
            except (TypeError, ValueError, OverflowError):  # loses this record only
                log.exception("store: record %s could not be encoded", r.trace_id)
                self._stats.store_errors.inc()
        try:
            with self._db_lock:
                self._db.execute("BEGIN")
                self._db.executemany(
                    "INSERT OR IGNORE INTO requests(trace_id, end_unix, model, complete, body)"
                    " VALUES (?, ?, ?, ?, ?)",
                    rows,
                )
                self._db.executemany(  # a client's or proxy's trace joined to the record
                    "INSERT INTO joined_traces(trace_id, record_id, end_unix) VALUES (?,?,?)",
                    [(t, r.record_id, r.end_unix) for r in records for t in r.joined_trace_ids],
                )
                self._db.executemany(
                    "INSERT INTO idle_cost(pool, start_unix, end_unix, dollars, energy_joules)"
                    " VALUES (?,?,?,?,?)",
                    [(i.pool, i.start_unix, i.end_unix, i.dollars,
                      i.energy_joules if math.isfinite(i.energy_joules) else 0.0)
                     for i in idle],
                )
                self._db.execute("COMMIT")
        except sqlite3.Error:
            log.exception("store write failed (%d items)", len(rows) + len(idle))
            self._stats.store_errors.inc(len(rows) + len(idle))
            try:
                with self._db_lock:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            return
        self._stats.records_stored.inc(len(rows))

    def _maybe_apply_retention(self) -> None:
        now = self._clock()
        if now - self._last_retention < self._config.retention_check_seconds:
            return
        self._last_retention = now
        try:
            self.apply_retention(now)
        except sqlite3.Error:  # the writer thread goes on; the next pass tries again
            log.exception("store retention pass failed")

    def apply_retention(self, now: float | None = None) -> int:
        cutoff = (self._clock() if now is None else now) - self._config.retention_seconds
        with self._db_lock:
            cur = self._db.execute("DELETE FROM requests WHERE end_unix < ?", (cutoff,))
            self._db.execute("DELETE FROM idle_cost WHERE end_unix < ?", (cutoff,))
            self._db.execute("DELETE FROM joined_traces WHERE end_unix < ?", (cutoff,))
        return cur.rowcount

    def shutdown(self) -> None:
        """Write everything queued, then close. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        self.flush()
        self._drops.flush()
        with self._db_lock:
            self._db.close()

    # --- reader ------------------------------------------------------------------------------

    def records(
        self, limit: int | None = None, since_unix: float | None = None,
        until_unix: float | None = None,
    ) -> list[RequestRecord]:
        """Newest first: those that ended at or after ``since_unix`` and at or before
        ``until_unix``."""
        sql = "SELECT body FROM requests"
        conditions: list[str] = []
        args: list[object] = []
        if since_unix is not None:
            conditions.append("end_unix >= ?")
            args.append(since_unix)
        if until_unix is not None:
            conditions.append("end_unix <= ?")
            args.append(until_unix)
        if conditions:
            sql += " WHERE " + " AND ".join(conditions)
        sql += " ORDER BY end_unix DESC"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        with self._db_lock:
            rows = self._db.execute(sql, args).fetchall()
        return [RequestRecord.from_json(decode_body(body)) for (body,) in rows]

    def record(self, record_id: str) -> RequestRecord | None:
        """The record with this id; given a trace id of several calls, its first."""
        with self._db_lock:
            row = self._db.execute("SELECT body FROM requests WHERE trace_id = ?",
                                   (record_id,)).fetchone()
        if row is not None:
            return RequestRecord.from_json(decode_body(row[0]))
        calls = self.records_of_trace(record_id)
        return calls[0] if calls else None

    def records_of_trace(self, trace_id: str) -> list[RequestRecord]:
        """Every record of one trace (its LLM calls), oldest first: those named after it
        and those it was joined to (a client traced apart from its serving side)."""
        if not trace_id or "-" in trace_id or "%" in trace_id or "_" in trace_id:
            return []
        with self._db_lock:
            rows = self._db.execute(
                "SELECT body FROM requests WHERE trace_id = ? OR trace_id LIKE ? OR trace_id IN "
                "(SELECT record_id FROM joined_traces WHERE trace_id = ?) ORDER BY end_unix",
                (trace_id, trace_id + "-%", trace_id)).fetchall()
        records = [RequestRecord.from_json(decode_body(body)) for (body,) in rows]
        return sorted(records, key=lambda r: r.start_unix)

    def idle_cost_dollars(self, since_unix: float | None = None) -> float:
        return self._idle_sum("dollars", since_unix)

    def idle_energy_joules(self, since_unix: float | None = None) -> float:
        return self._idle_sum("energy_joules", since_unix)

    def _idle_sum(self, column: str, since_unix: float | None) -> float:
        assert column in ("dollars", "energy_joules")
        sql = f"SELECT COALESCE(SUM({column}), 0) FROM idle_cost"
        args: list[object] = []
        if since_unix is not None:
            sql += " WHERE end_unix >= ?"
            args.append(since_unix)
        try:
            with self._db_lock:
                (total,) = self._db.execute(sql, args).fetchone()
        except sqlite3.OperationalError:  # a store written before the column, read-only
            if column == "dollars":
                raise
            return 0.0
        return float(total)

    def count(self) -> int:
        with self._db_lock:
            (n,) = self._db.execute("SELECT COUNT(*) FROM requests").fetchone()
        return int(n)


def open_store_readonly(path: str) -> RecordStore:
    """A store for reading (CLI), opened read-only (nothing in the file changes, not even
    its schema); errors name the path when it does not exist."""
    if not Path(path).expanduser().exists():
        raise ConfigError("store", f"no store at {path}")
    return RecordStore(StoreConfig(path=path, read_only=True))
