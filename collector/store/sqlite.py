"""The embedded store: request records and idle cost in SQLite, durable across restarts.

SQLite (stdlib, one file, WAL journal): it needs no server and no extra dependency on a
node, and each batch commits in one transaction, so a crash or SIGKILL leaves every
committed record intact and nothing half-written. Records are written in batches off the
ingest path by the one batching sender (collector/batch_sender.py), as the ClickHouse
store's are: a bounded queue (a full queue makes the caller wait, and admission refuses new
data past half of it) and one writer thread, which also deletes rows past
``retention_seconds`` (between batches, and once every ``retention_check_seconds`` while
idle). At shutdown it writes everything queued.

A record is one row of typed columns (collector/store/layout.py: the stages wide, the
names coded, the lists packed), and the writer adds it to rollups per 10 minutes
(collector/store/sqlite_sql.py), so the views (tokenpath/views.py) are SQL aggregates and
never load a window's records into Python. A non-finite float, which no record should
hold, is stored as NULL and read back as 0 (None where the field is optional). A record
that cannot be encoded at all is counted in ``store_errors`` and the rest of its batch is
written; the writer thread never stops on a bad record (nor on a batch that fails).
"""

from __future__ import annotations

import logging
import math
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import tokenpath.collector.store.layout as layout
import tokenpath.collector.store.sqlite_sql as store_sql
from tokenpath.collector.backpressure import DROP_STORE_CLOSED, Backlog, DropLog
from tokenpath.collector.batch_sender import DROP_CLOSED, BatchSender, SenderConfig
from tokenpath.collector.stats import CollectorStats
from tokenpath.collector.store.base import (
    MEMORY,
    Item,
    Store,
    StoreConfig,
    StoreQueries,
    split_batch,
)
from tokenpath.records import IdleCost, RequestRecord

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 500

# The records' tables come from collector/store/layout.py and collector/store/sqlite_sql.py.
_SCHEMA = """
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


class RecordStore(Store):
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
        self._drops = DropLog(self._stats, log, "store")
        self._db_lock = threading.Lock()
        self._names = layout.Names()
        self._encoder = layout.RowEncoder(self._names)
        self._rolled_rid = 0  # the rollups' watermark: they hold the records up to it
        self._rolled_at = time.monotonic()
        self._db = self._connect()
        self._reader_db, self._reader_lock, reader_names = self._open_reader()
        self.queries: StoreQueries = store_sql.SqliteQueries(
            self._reader_db, self._reader_lock, reader_names,
            None if self._config.read_only else self._config.retention_seconds)
        # Bounded: a put waits while it is full (back-pressure). A local file takes what
        # it is given or fails for good, so nothing is retried, and shutdown writes all
        # that is queued (no deadline).
        self._sender: BatchSender[Item, list[Item]] = BatchSender(
            "store", SenderConfig(self._config.queue_size,
                                  self._config.batch_size or DEFAULT_BATCH_SIZE,
                                  max_retry_seconds=math.inf, shutdown_seconds=math.inf),
            list, self._export, self._dropped, periodic=self._retention_tick)
        self._shut = False
        self._last_retention = 0.0

    @property
    def identity(self) -> str:
        path = self._config.path
        if path == MEMORY:
            return super().identity
        return f"sqlite://{socket.gethostname()}{Path(path).expanduser().resolve()}"

    def _connect(self) -> sqlite3.Connection:
        path = self._config.path
        if path != MEMORY:
            path = str(Path(path).expanduser())
        if self._config.read_only and path != MEMORY:
            uri = Path(path).resolve().as_uri() + "?mode=ro"
            db = sqlite3.connect(uri, uri=True, check_same_thread=False,
                                 isolation_level=None)
            _ensure_math(db)
            self._prepare_read_only(db)
            return db
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        _ensure_math(db)
        if path != MEMORY:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(f"PRAGMA cache_size=-{store_sql.WRITER_CACHE_KIB}")
        db.executescript(_SCHEMA)
        columns = {row[1] for row in db.execute("PRAGMA table_info(idle_cost)")}
        if "energy_joules" not in columns:  # a store written before energy was kept
            db.execute("ALTER TABLE idle_cost ADD COLUMN energy_joules REAL NOT NULL DEFAULT 0")
        db.executescript(layout.schema_sql())
        layout.add_missing_columns(db)
        self._names.load(db)
        store_sql.ensure_rollups(db)
        self._rolled_rid = store_sql.rollup_watermark(db)
        db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                   ("retention_seconds", repr(float(self._config.retention_seconds))))
        db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                   ("layout", str(layout.LAYOUT_VERSION)))
        return db

    def _prepare_read_only(self, db: sqlite3.Connection) -> None:
        """A reader of a store no collector has written yet reads empty temporary tables
        in the column layout; the file is never changed."""
        if _has_table(db, "main", "records"):
            layout.cover_missing_columns(db)  # written before the layout gained them
            return
        db.executescript(layout.schema_sql("temp"))
        db.executescript(store_sql.rollup_schema().replace(
            "CREATE TABLE IF NOT EXISTS ", "CREATE TABLE IF NOT EXISTS temp."))
        if not _has_table(db, "main", "joined_traces"):
            db.execute("CREATE TEMP TABLE joined_traces (trace_id TEXT NOT NULL, "
                       "record_id TEXT NOT NULL, end_unix REAL NOT NULL)")
        if not _has_table(db, "main", "idle_cost"):
            db.execute("CREATE TEMP TABLE idle_cost (pool TEXT NOT NULL, start_unix REAL "
                       "NOT NULL, end_unix REAL NOT NULL, dollars REAL NOT NULL, "
                       "energy_joules REAL NOT NULL DEFAULT 0)")
        db.execute("INSERT INTO temp.meta(key, value) VALUES ('rollup', ?)",
                   (store_sql.ROLLUP_SIGNATURE,))
        self._rolled_rid = 0

    def _insert_records(self, db: sqlite3.Connection, records: list[RequestRecord]) -> int:
        """Insert records (inside the caller's transaction) and add them to the rollups;
        returns how many were encoded. A record that cannot be encoded loses itself only."""
        rows = []
        for r in records:
            try:
                rows.append(encode_row(self._encoder, db, r))
            except (TypeError, ValueError, OverflowError, KeyError, AttributeError):
                log.exception("store: record %s could not be encoded", r.trace_id)
                self._stats.store_errors.inc()
        try:
            db.executemany(layout.INSERT_SQL, rows)
        except OverflowError:  # an integer past 64 bits: stored as a REAL
            db.executemany(layout.INSERT_SQL, [layout.sanitize(row) for row in rows])
        (after,) = db.execute("SELECT coalesce(max(rid), 0) FROM records").fetchone()
        self._roll_up(db, after)
        return len(rows)

    def _roll_up(self, db: sqlite3.Connection, newest: int, now: bool = False) -> None:
        """Add the records past the rollups' watermark to them when a run is due
        (collector/store/sqlite_sql.py), inside the caller's transaction."""
        rolled = self._rolled_rid
        if newest <= rolled:
            return
        clock = time.monotonic()
        if (now or newest - rolled >= store_sql.ROLLUP_EVERY_RECORDS
                or clock - self._rolled_at >= store_sql.ROLLUP_EVERY_SECONDS):
            store_sql.add_to_rollups(db, rolled, newest)
            self._rolled_rid = newest
            self._rolled_at = clock

    def _open_reader(self) -> tuple[sqlite3.Connection, threading.Lock, layout.Names]:
        """The connection the views read on: its own for a file the collector writes
        (WAL lets it read while the writer commits), else the writer's."""
        path = self._config.path
        if self._config.read_only or path == MEMORY:
            return self._db, self._db_lock, self._names
        uri = Path(path).expanduser().resolve().as_uri() + "?mode=ro"
        db = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
        _ensure_math(db)
        names = layout.Names()
        names.load(db)
        return db, threading.Lock(), names

    # --- sink ------------------------------------------------------------------------------

    def consume_record(self, record: RequestRecord) -> None:
        self._sender.put(record)

    def consume_idle_cost(self, idle: IdleCost) -> None:
        self._sender.put(idle)

    @property
    def queue_depth(self) -> int:
        """Items waiting for the writer or being written."""
        return self._sender.depth()

    def backlog(self) -> Backlog:
        """The write queue as admission sees it: past half of ``queue_size`` the
        receivers shed load."""
        return self._sender.backlog()

    def start(self) -> None:
        self._sender.start()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything handed in so far is written (by the writer thread; not
        started, each item was written when handed in); False when ``timeout`` passed
        first or the writer thread is gone."""
        return self._sender.flush(timeout)

    def _export(self, batch: list[Item]) -> None:
        """The sender's export: one batch in one transaction. It never raises (nothing is
        retried): a batch that fails is counted in ``store_errors``, the writer goes on."""
        try:
            self._write(batch)
        except Exception:  # a bug, not the database: the writer thread must not stop
            log.exception("store: a batch of %d items could not be written", len(batch))
            self._stats.store_errors.inc(len(batch))
            self._recover()

    def _dropped(self, reason: str, items: Sequence[Item]) -> None:
        records = sum(1 for i in items if isinstance(i, RequestRecord))
        self._drops.drop(DROP_STORE_CLOSED if reason == DROP_CLOSED else f"store_{reason}",
                         records)
        if len(items) > records:  # idle slices: no records, but lost all the same
            self._stats.store_errors.inc(len(items) - records)

    def _write(self, batch: list[Item]) -> None:
        records, idle = split_batch(batch, self._stats)
        stored = 0
        try:
            with self._db_lock:
                self._db.execute("BEGIN")
                stored = self._insert_records(self._db, records)
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
            log.exception("store write failed (%d items)", len(records) + len(idle))
            self._stats.store_errors.inc(len(records) + len(idle))
            self._recover()
            return
        self._stats.records_stored.inc(stored)

    def _recover(self) -> None:
        """After a failed batch: its transaction rolled back, and what the writer keeps of
        the database (the names, the rollups' watermark) read again."""
        try:
            with self._db_lock:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                self._names.forget()  # names the batch added are gone with it
                self._names.load(self._db)
                self._rolled_rid = store_sql.rollup_watermark(self._db)
        except sqlite3.Error:
            pass

    def _retention_tick(self) -> float:
        """The writer thread's periodic work, after each batch and while idle: a retention
        pass when one is due. Returns the seconds until the next is."""
        self._maybe_apply_retention()
        every = self._config.retention_check_seconds
        return min(every, max(0.0, self._last_retention + every - self._clock()))

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
            self._db.execute("BEGIN")
            try:
                cur = self._db.execute("DELETE FROM records WHERE end_unix < ?", (cutoff,))
                self._db.execute("DELETE FROM idle_cost WHERE end_unix < ?", (cutoff,))
                self._db.execute("DELETE FROM joined_traces WHERE end_unix < ?", (cutoff,))
                store_sql.apply_rollup_retention(self._db, cutoff)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return cur.rowcount

    def shutdown(self) -> None:
        """Write everything queued, then close. Idempotent."""
        if self._shut:
            return
        self._shut = True
        self._sender.shutdown()
        self._drops.flush()
        with self._db_lock:
            if not self._config.read_only:
                try:  # the rollups hold every record written: the next open reads none raw
                    self._db.execute("BEGIN")
                    (newest,) = self._db.execute(
                        "SELECT coalesce(max(rid), 0) FROM records").fetchone()
                    self._roll_up(self._db, newest, now=True)
                    self._db.execute("COMMIT")
                except sqlite3.Error:
                    log.exception("store: the last rollup run failed")
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
            self._db.close()
        if self._reader_db is not self._db:
            with self._reader_lock:
                self._reader_db.close()


def encode_row(encoder: layout.RowEncoder, db: sqlite3.Connection,
               record: RequestRecord) -> list[Any]:
    """A record's row in the column layout (collector/store/layout.py)."""
    return encoder.encode(db, record)


def _has_table(db: sqlite3.Connection, schema: str, name: str) -> bool:
    return db.execute(f"SELECT 1 FROM {schema}.sqlite_master WHERE type = 'table' AND name = ?",
                      (name,)).fetchone() is not None


def _ensure_math(db: sqlite3.Connection) -> None:
    """The SQL math functions the histograms use (``ln``, ``ceil``): built into SQLite
    3.35+ when compiled with them; else the same functions from Python's math module."""
    try:
        db.execute("SELECT ln(2.0), ceil(1.5)").fetchone()
    except sqlite3.OperationalError:
        db.create_function("ln", 1, _ln, deterministic=True)
        db.create_function("ceil", 1, _ceil, deterministic=True)


def _ln(value: float | None) -> float | None:
    if value is None or value <= 0:
        return None
    return math.log(value)


def _ceil(value: float | None) -> float | None:
    return None if value is None else float(math.ceil(value))
