"""What every store is: its configuration (``StoreConfig``), the writer-and-reader
interface (``Store``) and the reader's queries (``StoreQueries``). Two backends implement
it: the embedded SQLite store (collector/store/sqlite.py) and the ClickHouse store
(collector/store/clickhouse.py); collector/store/factory.py picks one for ``--store``.
This module imports neither.
"""

from __future__ import annotations

import logging
import math
import socket
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tokenpath.collector.backpressure import Backlog
from tokenpath.collector.stats import CollectorStats
from tokenpath.collector.store.url import is_clickhouse_url, parse_url
from tokenpath.config import ConfigError, check, validate_fields
from tokenpath.query import DEFAULT_PARAMS as _DEFAULT_PARAMS
from tokenpath.query import Aggregates, Coverage, GroupBy, Params, RecordQueries, Sample, Window
from tokenpath.records import IdleCost, RequestRecord

log = logging.getLogger(__name__)

DEFAULT_RETENTION_SECONDS = 7 * 86400.0
# How often the writer deletes rows past retention. Between batches it sleeps until the
# next record or the next retention pass, so an idle collector's store wakes once a minute.
DEFAULT_RETENTION_CHECK_SECONDS = 60.0
DEFAULT_QUEUE_SIZE = 100_000
DEFAULT_SHUTDOWN_SECONDS = 30.0  # a ClickHouse store's time to write its queue at shutdown
MEMORY = ":memory:"


@dataclass(frozen=True, slots=True)
class StoreConfig:
    path: str = MEMORY
    retention_seconds: float = field(default=DEFAULT_RETENTION_SECONDS, metadata=check(gt=0))
    # records written in one batch, at most; None: the backend's default
    # (DEFAULT_BATCH_SIZE for SQLite, the ClickHouse store's larger one)
    batch_size: int | None = field(default=None, metadata=check(ge=1, optional=True))
    retention_check_seconds: float = field(
        default=DEFAULT_RETENTION_CHECK_SECONDS,
        metadata=check(gt=0, finite=True, message="must be a finite number > 0"))
    queue_size: int = field(default=DEFAULT_QUEUE_SIZE, metadata=check(ge=1))
    read_only: bool = False  # a reader (CLI): the file is opened read-only, never changed
    # ClickHouse: how long a failed insert is retried before its records count as dropped
    # (by default while the collector runs), and how long shutdown waits for the queue
    write_retry_seconds: float = field(default=math.inf, metadata=check(ge=0))
    shutdown_seconds: float = field(default=DEFAULT_SHUTDOWN_SECONDS, metadata=check(ge=0))

    def validate(self) -> None:
        validate_fields(self, "store")
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


Item = RequestRecord | IdleCost  # what a store's writer takes


class StoreQueries(RecordQueries, Protocol):
    """A store's reader: the read interface (:class:`tokenpath.query.RecordQueries`, its
    thread contract included) and the record lookups the API serves."""

    def record(self, record_id: str) -> RequestRecord | None: ...

    def records_of_trace(self, trace_id: str) -> list[RequestRecord]: ...

    def coverage(self, now_unix: float | None = None) -> Coverage: ...

    def count(self, window: Window = Window()) -> int: ...


def split_batch(batch: Sequence[Item], stats: CollectorStats,
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
    the UI and the CLI use (``queries``, one per backend). Two backends: ``RecordStore``
    (SQLite, collector/store/sqlite.py) and ``ClickHouseStore``
    (collector/store/clickhouse.py).

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
        be waited for (the store's batching sender stopped)."""
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
