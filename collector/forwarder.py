"""``RecordForwarder``: the mapped records of a sharded replica, exported for pricing.

With ``tokenpath collector --forward-records URL`` the mapper's downstream is this sink
instead of the cost attributor: records go, as OTLP logs (:mod:`.record_logs`), to an
OTLP/HTTP logs endpoint (``.../v1/logs``, protobuf): the OpenTelemetry Collector's
loadbalancing exporter with ``routing_key: resource`` in front of the tokenpath
collectors, or one collector directly.

Never a silent loss: records wait in a bounded queue (``max_queue_records``); past half
of it the receivers shed load (:meth:`RecordForwarder.backlog`, collector/backpressure.py),
and when it is full the caller (the pipeline worker) waits for room instead of dropping,
so a slow pricing collector slows this one's intake rather than losing what it accepted.
A batch is retried on connection errors, 429, 502, 503 and 504 (honouring
``Retry-After``), with exponential backoff, for up to ``max_retry_seconds``; whatever is
given up is counted in ``tokenpath_collector_records_forward_dropped_total{reason}``:
``retry_expired``, ``rejected`` (a 4xx other than 429, or a partial success's rejected log
records), ``shutdown`` (still queued when the flush deadline ran out) and ``queue_full``
(the oldest records made room: only once the shutdown deadline has passed, or with the
sender thread gone).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse

from tokenpath.collector.backpressure import Backlog, high_water
from tokenpath.collector.record_logs import encode_records
from tokenpath.collector.stats import CollectorStats
from tokenpath.config import ConfigError
from tokenpath.pipeline import IdleCost
from tokenpath.records import RequestRecord

log = logging.getLogger(__name__)

DEFAULT_MAX_QUEUE_RECORDS = 100_000
DEFAULT_BATCH_RECORDS = 512
DEFAULT_MAX_RETRY_SECONDS = 300.0
DEFAULT_TIMEOUT_SECONDS = 10.0
DEFAULT_SHUTDOWN_SECONDS = 30.0
INITIAL_BACKOFF_SECONDS = 0.5
MAX_BACKOFF_SECONDS = 30.0
RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})
PROTOBUF = "application/x-protobuf"
# How long a caller waiting for room sleeps before it checks the sender and the deadline.
ROOM_WAIT_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class ForwarderConfig:
    url: str
    max_queue_records: int = DEFAULT_MAX_QUEUE_RECORDS
    batch_records: int = DEFAULT_BATCH_RECORDS
    max_retry_seconds: float = DEFAULT_MAX_RETRY_SECONDS
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    shutdown_seconds: float = DEFAULT_SHUTDOWN_SECONDS

    def validate(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError("forward_records", f"must be an http(s) URL, not {self.url!r}")
        for key in ("max_queue_records", "batch_records"):
            if getattr(self, key) < 1:
                raise ConfigError(f"forward_records.{key}", "must be >= 1")
        for key in ("max_retry_seconds", "timeout_seconds", "shutdown_seconds"):
            if not getattr(self, key) >= 0:
                raise ConfigError(f"forward_records.{key}", "must be >= 0")


class _GiveUp(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


class RecordForwarder:
    """A RecordSink that exports records as OTLP logs from its own thread."""

    def __init__(self, config: ForwarderConfig, stats: CollectorStats | None = None,
                 auth_token: str | None = None,
                 client: httpx.Client | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        config.validate()
        self._config = config
        self._stats = stats or CollectorStats()
        headers = {"Content-Type": PROTOBUF}
        if auth_token:
            headers["Authorization"] = f"Bearer {auth_token}"
        self._client = client or httpx.Client(timeout=config.timeout_seconds)
        self._headers = headers
        self._clock = clock
        self._queue: deque[RequestRecord] = deque()
        self._in_flight = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()  # wakes a backoff wait early
        self._closing = False
        self._abandoned = False
        self._drain_deadline: float | None = None  # set by begin_shutdown()
        self._thread: threading.Thread | None = None

    # --- RecordSink ----------------------------------------------------------------------

    def consume_record(self, record: RequestRecord) -> None:
        with self._cond:
            while self._full() and self._may_wait():
                self._cond.wait(ROOM_WAIT_SECONDS)  # a sent batch makes room (notify_all)
            if self._full() and self._queue:  # no more waiting: the oldest makes room
                self._queue.popleft()
                self._stats.records_forward_dropped.inc("queue_full")
            self._queue.append(record)
            self._cond.notify_all()
        if self._thread is None:
            self._drain_inline()

    def consume_idle_cost(self, idle: IdleCost) -> None:
        """Nothing is priced here: idle cost is the pricing collector's."""

    def backlog(self) -> Backlog:
        """Records queued or being sent, as admission sees them: past half of
        ``max_queue_records`` the receivers shed load."""
        return Backlog("forwarder queue", self._held, high_water(self._config.max_queue_records))

    def _held(self) -> int:
        return len(self._queue) + self._in_flight

    def _full(self) -> bool:
        return len(self._queue) + self._in_flight >= self._config.max_queue_records

    def _may_wait(self) -> bool:
        """Whether a caller may wait for room (lock held): while the sender runs and the
        shutdown deadline (begin_shutdown) has not passed."""
        thread = self._thread
        if thread is None or not thread.is_alive() or self._abandoned:
            return False
        return self._drain_deadline is None or self._clock() < self._drain_deadline

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="tokenpath-forwarder",
                                        daemon=True)
        self._thread.start()

    def begin_shutdown(self) -> None:
        """The collector is stopping: from now on the flush deadline (``shutdown_seconds``)
        runs, for records still handed in (the pipeline draining) and :meth:`shutdown`
        alike, so a peer that takes nothing cannot hold the shutdown longer."""
        with self._cond:
            if self._drain_deadline is None:
                self._drain_deadline = self._clock() + self._config.shutdown_seconds
            self._cond.notify_all()

    def shutdown(self) -> None:
        """Send what is queued, until the flush deadline (``shutdown_seconds`` from
        :meth:`begin_shutdown` or from now); count the rest. Idempotent."""
        self.begin_shutdown()
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._cond.notify_all()
            assert self._drain_deadline is not None
            left = max(0.0, self._drain_deadline - self._clock())
        if self._thread is not None:
            self._thread.join(left)
            with self._cond:
                self._abandoned = True  # past the deadline: take no further batch
            self._stop.set()  # cut a backoff short
            self._thread.join()  # at most the POST in progress (timeout_seconds)
        with self._cond:
            left = len(self._queue)
            self._queue.clear()
        self._stats.records_forward_dropped.inc("shutdown", left)
        if left:
            log.warning("forwarder: %d records not sent before the shutdown deadline", left)
        self._client.close()

    # --- the exporter thread -------------------------------------------------------------

    def _take(self, wait: bool) -> list[RequestRecord]:
        with self._cond:
            while wait and not self._queue and not self._closing:
                self._cond.wait()
            if self._abandoned:
                return []
            n = min(len(self._queue), self._config.batch_records)
            batch = [self._queue.popleft() for _ in range(n)]
            self._in_flight = len(batch)
            return batch

    def _run(self) -> None:
        while True:
            batch = self._take(wait=True)
            if not batch:
                return  # closing and empty
            self._send(batch)

    def _drain_inline(self) -> None:
        """Without a started thread (tests, tools): send synchronously."""
        while batch := self._take(wait=False):
            self._send(batch)

    def _send(self, batch: list[RequestRecord]) -> None:
        body = encode_records(batch).SerializeToString()
        deadline = self._clock() + self._config.max_retry_seconds
        backoff = INITIAL_BACKOFF_SECONDS
        try:
            while True:
                try:
                    rejected = self._post(body)
                except _GiveUp as exc:
                    self._stats.records_forward_dropped.inc(exc.reason, len(batch))
                    return
                except _Retry as retry:
                    delay = retry.after if retry.after is not None else backoff
                    backoff = min(MAX_BACKOFF_SECONDS, backoff * 2)
                    if self._stop.is_set():  # the shutdown deadline passed
                        with self._cond:
                            self._queue.extendleft(reversed(batch))  # counted as shutdown
                        return
                    if self._clock() + delay > deadline:
                        self._stats.records_forward_dropped.inc("retry_expired", len(batch))
                        log.warning("forwarder: gave up on %d records after retrying: %s",
                                    len(batch), retry)
                        return
                    self._stop.wait(delay)
                    continue
                with self._cond:
                    self._stats.records_forwarded.inc(len(batch) - rejected)
                self._stats.records_forward_dropped.inc("rejected", rejected)
                return
        finally:
            with self._cond:
                self._in_flight = 0
                self._cond.notify_all()  # room for a caller waiting in consume_record

    def _post(self, body: bytes) -> int:
        """One POST; returns the records the receiver refused (partial success)."""
        try:
            response = self._client.post(self._config.url, content=body, headers=self._headers)
        except httpx.HTTPError as exc:
            raise _Retry(f"{type(exc).__name__}: {exc}", None) from exc
        if response.status_code == 200:
            parsed = ExportLogsServiceResponse()
            try:
                parsed.ParseFromString(response.content)
            except Exception:  # protobuf raises DecodeError; a 200 took the data
                return 0
            rejected = parsed.partial_success.rejected_log_records
            if rejected:
                log.warning("forwarder: %d records refused: %s", rejected,
                            parsed.partial_success.error_message)
            return int(rejected)
        if response.status_code in RETRYABLE_STATUSES:
            raise _Retry(f"HTTP {response.status_code}", _retry_after(response))
        log.error("forwarder: %s answered HTTP %d; dropping the batch", self._config.url,
                  response.status_code)
        raise _GiveUp("rejected")


class _Retry(Exception):
    def __init__(self, message: str, after: float | None) -> None:
        super().__init__(message)
        self.after = after
