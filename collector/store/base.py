"""The embedded store: request records and idle cost, durable across restarts.

SQLite (stdlib, one file, WAL journal): it needs no server and no extra dependency on a
node, and each batch commits in one transaction, so a crash or SIGKILL leaves every
committed record intact and nothing half-written. Records are written in batches by a
writer thread, off the ingest path; old rows are deleted after ``retention_seconds``.

A record is one row of typed columns (collector/store/layout.py: the stages wide, the
names coded, the lists packed), and the writer adds it to rollups per 10 minutes
(collector/store/sqlite_sql.py), so the views (tokenpath/views.py) are SQL aggregates and never
load a window's records into Python. A store written in the first layout (a JSON body per
row in ``requests``) is moved to this one when the collector opens it, with a log line; a
read-only reader of such a store reads a temporary copy. A non-finite float, which no
record should hold, is stored as NULL and read back as 0 (None where the field is
optional). A record that cannot be encoded at all is counted in ``store_errors`` and the
rest of its batch is written; the writer thread never stops on a bad record.
"""

from __future__ import annotations

import json
import logging
import math
import queue
import socket
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson

import tokenpath.collector.store.layout as layout
import tokenpath.collector.store.sqlite_sql as store_sql
from tokenpath.collector.backpressure import (
    DROP_STORE_CLOSED,
    Backlog,
    DropLog,
    high_water,
)
from tokenpath.collector.stats import CollectorStats
from tokenpath.collector.store.url import is_clickhouse_url, parse_url
from tokenpath.config import ConfigError
from tokenpath.query import DEFAULT_PARAMS as _DEFAULT_PARAMS
from tokenpath.query import Aggregates, Coverage, GroupBy, Params, Sample, Window
from tokenpath.records import IdleCost, RequestRecord

log = logging.getLogger(__name__)

DEFAULT_RETENTION_SECONDS = 7 * 86400.0
DEFAULT_BATCH_SIZE = 500
# How often the writer deletes rows past retention. Between batches it sleeps until the
# next record or the next retention pass, so an idle collector's store wakes once a minute.
DEFAULT_RETENTION_CHECK_SECONDS = 60.0
DEFAULT_QUEUE_SIZE = 100_000
DEFAULT_SHUTDOWN_SECONDS = 30.0  # a ClickHouse store's time to write its queue at shutdown
# How long a put into a full queue waits before it checks that the writer still runs.
PUT_WAIT_SECONDS = 1.0
MEMORY = ":memory:"

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


# The first layout: one JSON body per record in ``requests`` (its key column, named
# trace_id, held the record id). Read only to move its records to the column layout.
LEGACY_TABLE = "requests"
MIGRATION_CHUNK = 5_000


def encode_body(record: RequestRecord) -> str:
    """A record's JSON (the first layout's row body), by orjson; by the stdlib encoder
    for what orjson refuses (an integer past 64 bits, from a garbled token count)."""
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
    # records written in one batch, at most; None: the backend's default
    # (DEFAULT_BATCH_SIZE for SQLite, the ClickHouse store's larger one)
    batch_size: int | None = None
    retention_check_seconds: float = DEFAULT_RETENTION_CHECK_SECONDS
    queue_size: int = DEFAULT_QUEUE_SIZE
    read_only: bool = False  # a reader (CLI): the file is opened read-only, never changed
    # ClickHouse: how long a failed insert is retried before its records count as dropped
    # (by default while the collector runs), and how long shutdown waits for the queue
    write_retry_seconds: float = math.inf
    shutdown_seconds: float = DEFAULT_SHUTDOWN_SECONDS

    def validate(self) -> None:
        if self.retention_seconds <= 0:
            raise ConfigError("store.retention_seconds", "must be > 0")
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError("store.batch_size", "must be >= 1")
        every = self.retention_check_seconds
        if not (every > 0 and math.isfinite(every)):
            raise ConfigError("store.retention_check_seconds", "must be a finite number > 0")
        if self.queue_size < 1:
            raise ConfigError("store.queue_size", "must be >= 1")
        for key in ("write_retry_seconds", "shutdown_seconds"):
            if not getattr(self, key) >= 0:
                raise ConfigError(f"store.{key}", "must be >= 0")
        if is_clickhouse_url(self.path):
            target = parse_url(self.path)
            if target.chdb:
                parent = Path(target.path).resolve().parent
                if not parent.is_dir():
                    raise ConfigError("store.path", f"folder {parent} does not exist")
        elif self.path != MEMORY:
            parent = Path(self.path).expanduser().resolve().parent
            if not parent.is_dir():
                raise ConfigError("store.path", f"folder {parent} does not exist")


_Item = RequestRecord | IdleCost


class StoreQueries(Protocol):
    """What a store's reader answers: the views' interface and the record lookups."""

    def aggregate(self, window: Window, measures: Sequence[str],
                  histograms: Sequence[str] = (), group_by: GroupBy = None,
                  params: Params = _DEFAULT_PARAMS) -> dict[Any, Aggregates]: ...

    def end_range(self, window: Window) -> tuple[float, float] | None: ...

    def sample(self, window: Window, limit: int, fingerprinted: bool = False) -> Sample: ...

    def records(self, limit: int | None = None, since_unix: float | None = None,
                until_unix: float | None = None) -> list[RequestRecord]: ...

    def record(self, record_id: str) -> RequestRecord | None: ...

    def records_of_trace(self, trace_id: str) -> list[RequestRecord]: ...

    def idle_cost_dollars(self, since_unix: float | None = None) -> float: ...

    def idle_energy_joules(self, since_unix: float | None = None) -> float: ...

    def coverage(self, now_unix: float | None = None) -> Coverage: ...

    def count(self, window: Window = Window()) -> int: ...


def split_batch(batch: Sequence[_Item], stats: CollectorStats,
                ) -> tuple[list[RequestRecord], list[IdleCost]]:
    """A batch's records and its finite idle slices; a non-finite slice is counted and
    logged, and loses only itself, not the batch it came in."""
    records = [i for i in batch if isinstance(i, RequestRecord)]
    idle = []
    for i in batch:
        if not isinstance(i, IdleCost):
            continue
        if math.isfinite(i.dollars) and math.isfinite(i.start_unix) and math.isfinite(
                i.end_unix):
            idle.append(i)
        else:
            log.error("store: idle cost slice of pool %s is not finite", i.pool)
            stats.store_errors.inc()
    return records, idle


class Store(ABC):
    """A store: a sink of records and idle cost (its writer), and the reader the API,
    the UI and the CLI use (``queries``, one per backend). Two backends:
    :class:`RecordStore` (SQLite) and ``ClickHouseStore`` (collector/store/clickhouse.py).

    Thread contract: ``consume_*`` run on the pipeline thread (and may wait there while
    the writer is behind: back-pressure); the readers on any thread; ``start``,
    ``announce_api`` and ``shutdown`` on the collector's."""

    queries: StoreQueries
    _clock: Callable[[], float]

    @abstractmethod
    def consume_record(self, record: RequestRecord) -> None:
        ...

    @abstractmethod
    def consume_idle_cost(self, idle: IdleCost) -> None:
        ...

    @abstractmethod
    def backlog(self) -> Backlog:
        ...

    @abstractmethod
    def start(self) -> None:
        ...

    @abstractmethod
    def flush(self) -> bool:
        """Write what was handed in so far before returning; False when that could not
        be waited for (a ClickHouse store's sender stopped)."""
        ...

    @abstractmethod
    def shutdown(self) -> None:
        ...

    def announce_api(self, url: str) -> None:  # noqa: B027 - most stores have nothing to say
        """The collector's API URL, once it listens (a chDB store names it to readers)."""

    # --- reader ------------------------------------------------------------------------------

    def records(
        self, limit: int | None = None, since_unix: float | None = None,
        until_unix: float | None = None,
    ) -> list[RequestRecord]:
        """Newest first: those that ended at or after ``since_unix`` and at or before
        ``until_unix`` (a bounded page: views over a window use :meth:`aggregate`)."""
        return self.queries.records(limit, since_unix, until_unix)

    def record(self, record_id: str) -> RequestRecord | None:
        """The record with this id; given a trace id of several calls, its first."""
        found = self.queries.record(record_id)
        if found is not None:
            return found
        calls = self.records_of_trace(record_id)
        return calls[0] if calls else None

    def records_of_trace(self, trace_id: str) -> list[RequestRecord]:
        """Every record of one trace (its LLM calls), oldest first: those named after it
        and those it was joined to (a client traced apart from its serving side)."""
        if not trace_id or "-" in trace_id or "%" in trace_id or "_" in trace_id:
            return []
        return self.queries.records_of_trace(trace_id)

    # tokenpath.query.RecordQueries: the views' interface (tokenpath/views.py)

    def aggregate(self, window: Window, measures: Sequence[str],
                  histograms: Sequence[str] = (), group_by: GroupBy = None,
                  params: Params = _DEFAULT_PARAMS) -> dict[Any, Aggregates]:
        return self.queries.aggregate(window, measures, histograms, group_by, params)

    def end_range(self, window: Window) -> tuple[float, float] | None:
        return self.queries.end_range(window)

    def sample(self, window: Window, limit: int, fingerprinted: bool = False) -> Sample:
        return self.queries.sample(window, limit, fingerprinted)

    def coverage(self) -> Coverage:
        return self.queries.coverage(self._clock())

    def idle_cost_dollars(self, since_unix: float | None = None) -> float:
        return self.queries.idle_cost_dollars(since_unix)

    def idle_energy_joules(self, since_unix: float | None = None) -> float:
        return self.queries.idle_energy_joules(since_unix)

    def count(self) -> int:
        return self.queries.count()

    @property
    def identity(self) -> str:
        """The database this store reads, named the same by every collector that shares it:
        the remote reader (tokenpath/cli/remote.py) counts such collectors' answers once."""
        return f"{type(self).__name__}:{socket.gethostname()}:{id(self)}"


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
        # Bounded: a put waits while it is full (back-pressure), never drops (_put).
        self._queue: queue.Queue[_Item | None] = queue.Queue(self._config.queue_size)
        self._drops = DropLog(self._stats, log, "store")
        self._writer_gone = False
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
        self._thread: threading.Thread | None = None
        self._closed = False
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
        if _has_table(db, "main", LEGACY_TABLE):
            store_sql.ensure_rollups(db)
            self._rolled_rid = store_sql.rollup_watermark(db)
            self._migrate_legacy(db, path)
        store_sql.ensure_rollups(db)
        self._rolled_rid = store_sql.rollup_watermark(db)
        db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                   ("retention_seconds", repr(float(self._config.retention_seconds))))
        db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)",
                   ("layout", str(layout.LAYOUT_VERSION)))
        return db

    def _prepare_read_only(self, db: sqlite3.Connection) -> None:
        """A reader of a store in the first layout (or of one no collector has written
        yet) reads a temporary copy in the column layout; the file is never changed."""
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
        if _has_table(db, "main", LEGACY_TABLE):
            log.warning("store %s is in the first layout (a JSON body per record): reading "
                        "a temporary copy; the collector moves it to the column layout when "
                        "it next opens it", self._config.path)
            self._migrate_legacy(db, self._config.path, drop=False)

    def _migrate_legacy(self, db: sqlite3.Connection, path: str, drop: bool = True) -> None:
        """Move the first layout's records (``requests``) into ``records``, a chunk a
        transaction (a crash resumes where it stopped); then drop ``requests``. With
        ``drop`` False (a read-only reader) they are copied, the file left as it is."""
        (total,) = db.execute(f"SELECT count(*) FROM {LEGACY_TABLE}").fetchone()
        log.warning("store %s: moving %d records from the JSON layout (table %s) to the "
                    "column layout (table records)", path, total, LEGACY_TABLE)
        after = -1
        moved = 0
        while True:
            rows = db.execute(f"SELECT rowid, body FROM {LEGACY_TABLE} WHERE rowid > ? "
                              "ORDER BY rowid LIMIT ?", (after, MIGRATION_CHUNK)).fetchall()
            if not rows:
                break
            records = []
            for _, body in rows:
                try:
                    records.append(RequestRecord.from_json(decode_body(body)))
                except (KeyError, TypeError, ValueError):
                    log.exception("store: a row of %s could not be read; skipped",
                                  LEGACY_TABLE)
            db.execute("BEGIN")
            self._insert_records(db, records)
            after = rows[-1][0]
            if drop:
                db.execute(f"DELETE FROM {LEGACY_TABLE} WHERE rowid <= ?", (after,))
            db.execute("COMMIT")
            moved += len(records)
        db.execute("BEGIN")
        (newest,) = db.execute("SELECT coalesce(max(rid), 0) FROM records").fetchone()
        self._roll_up(db, newest, now=True)
        db.execute("COMMIT")
        if drop:
            db.execute(f"DROP TABLE {LEGACY_TABLE}")
        log.warning("store %s: %d records now in the column layout", path, moved)

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
            while len(batch) < (self._config.batch_size or DEFAULT_BATCH_SIZE):
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

    def flush(self) -> bool:
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
        return True

    def _write(self, batch: list[_Item]) -> None:
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
            try:
                with self._db_lock:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    self._names.forget()  # names the batch added are gone with it
                    self._names.load(self._db)
                    self._rolled_rid = store_sql.rollup_watermark(self._db)
            except sqlite3.Error:
                pass
            return
        self._stats.records_stored.inc(stored)

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

    def _drain(self) -> bool:
        """Stops the writer after it wrote everything queued; False when already closed."""
        if self._closed:
            return False
        self._closed = True
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        self.flush()
        self._drops.flush()
        return True

    def shutdown(self) -> None:
        """Write everything queued, then close. Idempotent."""
        if not self._drain():
            return
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
