"""The ClickHouse store: the same records, queue and views as the embedded SQLite store
(collector/store/sqlite.py), kept in ClickHouse through clickhouse-connect, one client for both
targets:

- ``chdb:///PATH``: chDB, the ClickHouse engine in-process, its data in the folder PATH
  (one process at a time: while a collector owns it, a CLI reader is told to ask the
  collector, ``--collector URL``);
- ``clickhouse://[user@]host[:port]/db`` (``clickhouses://``: TLS): a server. The password
  comes from $TOKENPATH_CLICKHOUSE_PASSWORD or the file named by
  $TOKENPATH_CLICKHOUSE_PASSWORD_FILE, never from the URL (which ps and logs show).

The schema, the rows and the views' queries are in collector/store/clickhouse_sql.py.

**Writes** go through the one batching sender (collector/batch_sender.py): a bounded queue
(a full queue makes the caller wait, and admission refuses new data past half of it),
batches by one thread. A batch whose insert fails for a reason that passes (the server
down or restarting, a timeout, too many parts, memory) is retried with backoff, with the
same deduplication tokens, so a retry after a lost answer writes nothing twice, for up to
``write_retry_seconds`` (by default as long as the collector runs: meanwhile it pushes
back, and loses nothing it answered 200). One the server refuses for good (a wrong type, a
missing table) is given up at once. What is given up is counted in
``tokenpath_collector_records_dropped_total{reason}`` (``store_write_failed``,
``store_rejected``, ``store_shutdown``: still queued when the shutdown deadline ran out).
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tokenpath.collector.store.clickhouse_rollups as chrollups
import tokenpath.collector.store.clickhouse_sql as chsql
import tokenpath.collector.store.layout as L
from tokenpath.collector.backpressure import DROP_STORE_CLOSED, Backlog, DropLog
from tokenpath.collector.batch_sender import (
    DROP_CLOSED,
    DROP_RETRY_EXPIRED,
    BatchSender,
    GiveUp,
    Retry,
    SenderConfig,
)
from tokenpath.collector.stats import CollectorStats
from tokenpath.collector.store.base import Store, StoreConfig, split_batch
from tokenpath.collector.store.clickhouse_client import Connection, Owner, connect
from tokenpath.collector.store.url import parse_url
from tokenpath.config import ConfigError
from tokenpath.records import IdleCost, RequestRecord

log = logging.getLogger(__name__)

# a failed insert is retried while the collector runs (it pushes back meanwhile)
DEFAULT_WRITE_RETRY_SECONDS = math.inf
# Rows an insert carries, at most: each insert costs the server (and the rollups' views)
# about the same whatever its size, so ClickHouse wants them large (docs/operations.md).
DEFAULT_BATCH_SIZE = 5_000
DEFAULT_SHUTDOWN_SECONDS = 30.0  # to write what is queued at shutdown, then count the rest
DROP_STORE_WRITE_FAILED = "store_write_failed"  # the inserts failed past the retry time
# ClickHouse error codes that pass: a retry may succeed (the rest are refusals for good)
TRANSIENT_ERROR_CODES = frozenset({
    159,  # TIMEOUT_EXCEEDED
    164,  # READONLY (a replica that lost its keeper)
    202,  # TOO_MANY_SIMULTANEOUS_QUERIES
    209,  # SOCKET_TIMEOUT
    210,  # NETWORK_ERROR
    241,  # MEMORY_LIMIT_EXCEEDED
    242,  # TABLE_IS_READ_ONLY
    252,  # TOO_MANY_PARTS
    285,  # TOO_FEW_LIVE_REPLICAS
    319,  # UNKNOWN_STATUS_OF_INSERT
    394,  # QUERY_WAS_CANCELLED
    425,  # SYSTEM_ERROR
    999,  # KEEPER_EXCEPTION
})
_ERROR_CODE = re.compile(r"Code: (\d+)")


def _batch_token(kind: str, keys: Sequence[str]) -> str:
    digest = hashlib.sha256("\n".join(keys).encode()).hexdigest()
    return f"{kind}-{len(keys)}-{digest}"


def is_transient(exc: BaseException) -> bool:
    """Whether a failed insert may succeed if tried again: the server unreachable or
    restarting (clickhouse-connect's OperationalError, a socket error) or a ClickHouse
    error code of :data:`TRANSIENT_ERROR_CODES`; not a refusal of the data itself."""
    if isinstance(exc, OSError):  # TimeoutError and ConnectionError included
        return True
    if type(exc).__name__ in ("OperationalError", "StreamClosedError"):
        return True
    match = _ERROR_CODE.search(str(exc))
    return match is not None and int(match.group(1)) in TRANSIENT_ERROR_CODES


@dataclass(slots=True)
class Batch:
    """One batch's rows for each table, encoded once (a retry sends the same rows with
    the same deduplication tokens)."""

    records: int
    inserts: list[tuple[str, list[list[Any]], Sequence[str], str]]


class ClickHouseWriter:
    """Encodes a batch (records, their joined traces, idle cost) and inserts it; the
    batching sender retries it."""

    def __init__(self, conn: Connection, stats: CollectorStats) -> None:
        self._conn = conn
        self._stats = stats
        self._encoder = L.RowEncoder(chsql.TextNames())

    def prepare(self, records: list[RequestRecord], idle: list[IdleCost]) -> Batch:
        """The batch's rows; a record that cannot be encoded is counted in store_errors
        and left out, not its batch."""
        rows, ids = [], []
        for r in records:
            try:
                rows.append(chsql.encode(self._encoder, r))
                ids.append(r.record_id)
            except (TypeError, ValueError, OverflowError, KeyError, AttributeError):
                log.exception("store: record %s could not be encoded", r.trace_id)
                self._stats.store_errors.inc()
        joined = [[t, r.record_id, r.end_unix] for r in records for t in r.joined_trace_ids]
        idle_rows = [[i.pool, i.start_unix, i.end_unix, i.dollars,
                      i.energy_joules if math.isfinite(i.energy_joules) else 0.0]
                     for i in idle]
        return Batch(len(rows), [
            ("records", rows, L.COLUMNS, _batch_token("records", ids)),
            ("joined_traces", joined, ("trace_id", "record_id", "end_unix"),
             _batch_token("joined", [f"{a}/{b}" for a, b, _ in joined])),
            ("idle_cost", idle_rows,
             ("pool", "start_unix", "end_unix", "dollars", "energy_joules"),
             _batch_token("idle", [repr(r) for r in idle_rows])),
        ])

    def write(self, batch: Batch) -> None:
        """Insert every table's rows. Raises :class:`Retry` when it may pass (the inserts
        already made are deduplicated when the batch comes again), :class:`GiveUp` when
        the server refused the data."""
        for table, rows, columns, token in batch.inserts:
            try:
                self._conn.insert(table, rows, columns, token, chrollups.INSERT_SETTINGS)
            except Exception as exc:
                message = f"insert into {table} failed: {type(exc).__name__}: {str(exc)[:300]}"
                if is_transient(exc):
                    raise Retry(message) from exc
                raise GiveUp(message) from exc


class ClickHouseStore(Store):
    """The store in ClickHouse: the batching sender writes, :class:`ClickHouseQueries`
    read (the views' SQL); retention is the tables' TTL."""

    def __init__(self, config: StoreConfig, stats: CollectorStats | None = None,
                 clock: Callable[[], float] = time.time, client: Any = None) -> None:
        """``client``: a clickhouse-connect client to use instead of connecting to
        ``config.path`` (only its ``query``, ``command``, ``insert`` and ``close``)."""
        config.validate()
        self._config = config
        self._stats = stats or CollectorStats()
        self._clock = clock
        self._drops = DropLog(self._stats, log, "store")
        target = parse_url(config.path)
        self.target = target
        if config.read_only and target.chdb and not (Path(target.path) / "metadata").is_dir():
            raise ConfigError("store", f"no store at {target.describe()}")
        self._owner = Owner(target.path, exclusive=not config.read_only) \
            if target.chdb and client is None else None
        try:
            self._conn = Connection(connect(target) if client is None else client)
            if config.read_only:
                if not self._conn.rows("EXISTS TABLE records")[0][0]:
                    raise ConfigError("store", f"no store at {target.describe()}")
            else:
                chsql.ensure_schema(self._conn, config.retention_seconds)
        except ConfigError:
            self._release()
            raise
        except Exception as exc:
            self._release()
            raise ConfigError("store", f"cannot open {target.describe()}: "
                              f"{type(exc).__name__}: {str(exc)[:300]}") from None
        self._writer = ClickHouseWriter(self._conn, self._stats)
        self._shut = False
        self._sender: BatchSender[RequestRecord | IdleCost, Batch] = BatchSender(
            "store", SenderConfig(config.queue_size, config.batch_size or DEFAULT_BATCH_SIZE,
                                  config.write_retry_seconds, config.shutdown_seconds),
            self._prepare, self._export, self._dropped)
        self.queries = chsql.ClickHouseQueries(
            self._conn, None if config.read_only else config.retention_seconds)
        log.info("store: %s", target.describe())

    def _release(self) -> None:
        if self._owner is not None:
            self._owner.release()
            self._owner = None

    @property
    def identity(self) -> str:
        """The server's URL without credentials (a chDB folder: with this host's name),
        as every replica sharing the database is configured with it."""
        if self.target.chdb:
            return f"chdb://{socket.gethostname()}{Path(self.target.path).resolve()}"
        return self.target.describe()

    def announce_api(self, url: str) -> None:
        if self._owner is not None:
            self._owner.announce(url)

    # --- sink ------------------------------------------------------------------------------

    def consume_record(self, record: RequestRecord) -> None:
        self._sender.put(record)

    def consume_idle_cost(self, idle: IdleCost) -> None:
        self._sender.put(idle)

    def backlog(self) -> Backlog:
        return self._sender.backlog()

    @property
    def queue_depth(self) -> int:
        return self._sender.depth()

    def start(self) -> None:
        self._sender.start()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until what was handed in so far is written (or counted as dropped); False
        when ``timeout`` passed first or the sender is not running."""
        return self._sender.flush(timeout)

    def shutdown(self) -> None:
        """Write what is queued (until ``shutdown_seconds``), then close. Idempotent."""
        if self._shut:
            return
        self._shut = True
        self._sender.shutdown()
        self._drops.flush()
        try:
            self._conn.close()
        finally:
            self._release()

    def _prepare(self, items: list[RequestRecord | IdleCost]) -> Batch:
        return self._writer.prepare(*split_batch(items, self._stats))

    def _export(self, batch: Batch) -> None:
        self._writer.write(batch)
        self._stats.records_stored.inc(batch.records)

    def _dropped(self, reason: str, items: Sequence[RequestRecord | IdleCost]) -> None:
        records = sum(1 for i in items if isinstance(i, RequestRecord))
        label = {DROP_RETRY_EXPIRED: DROP_STORE_WRITE_FAILED,
                 DROP_CLOSED: DROP_STORE_CLOSED}.get(reason, f"store_{reason}")
        self._drops.drop(label, records)
        if len(items) > records:  # idle slices: no records, but lost all the same
            self._stats.store_errors.inc(len(items) - records)
