"""``RecordForwarder``: the mapped records of a sharded replica, exported for pricing.

With ``tokenpath collector --forward-records URL`` the mapper's downstream is this sink
instead of the cost attributor: records go, as OTLP logs (:mod:`.record_logs`), to an
OTLP/HTTP logs endpoint (``.../v1/logs``, protobuf): the OpenTelemetry Collector's
loadbalancing exporter with ``routing_key: resource`` in front of the tokenpath
collectors, or one collector directly.

Never a silent loss: the records go through a :class:`~.batch_sender.BatchSender` (a
bounded queue of ``max_queue_records`` that makes the caller wait when full and tells
admission to shed load past half of it, batches, retries, a shutdown deadline), so a slow
pricing collector slows this one's intake rather than losing what it accepted. A batch is
retried on connection errors, 429, 502, 503 and 504 (honouring ``Retry-After``) for up to
``max_retry_seconds``; whatever is given up is counted in
``tokenpath_collector_records_forward_dropped_total{reason}``: ``retry_expired``,
``rejected`` (a 4xx other than 429, or a partial success's rejected log records),
``shutdown`` (still queued when the flush deadline ran out), ``queue_full`` (the oldest
records made room: only once the shutdown deadline has passed, or with the sender thread
gone) and ``closed`` (handed in after shutdown).

Progress (collector/forward_progress.py): every ``progress_seconds`` (the pipeline's
tick) the forwarder queues, behind the records, one progress message per pricing unit it
forwards; they travel in the same batches, or alone as a heartbeat when no record is
going. At shutdown each unit gets a final one, so the pricing collector stops waiting for
this replica as soon as its records are in. Every log record names this replica
(``source_id``: host, process and a random part, unless configured).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

import httpx
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse

from tokenpath.collector.backpressure import Backlog
from tokenpath.collector.batch_sender import (
    DROP_REJECTED,
    BatchSender,
    GiveUp,
    Retry,
    SenderConfig,
)
from tokenpath.collector.cost.attributor import AttributorConfig
from tokenpath.collector.forward_progress import ForwardProgress
from tokenpath.collector.record_logs import OutgoingPricedPart, OutgoingProgress, encode_records
from tokenpath.collector.stats import CollectorStats
from tokenpath.config import ConfigError, check, validate_fields
from tokenpath.records import IdleCost, RequestRecord

log = logging.getLogger(__name__)

DEFAULT_MAX_QUEUE_RECORDS = 100_000
DEFAULT_BATCH_RECORDS = 512
DEFAULT_MAX_RETRY_SECONDS = 300.0
DEFAULT_TIMEOUT_SECONDS = 10.0
DEFAULT_SHUTDOWN_SECONDS = 30.0
DEFAULT_PROGRESS_SECONDS = 1.0
RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})
PROTOBUF = "application/x-protobuf"


def default_source_id() -> str:
    """This process as a source of forwarded records: host, pid and a random part (a
    restarted replica is a new source; the old one leaves when it times out)."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True, slots=True)
class ForwarderConfig:
    url: str
    max_queue_records: int = field(default=DEFAULT_MAX_QUEUE_RECORDS, metadata=check(ge=1))
    batch_records: int = field(default=DEFAULT_BATCH_RECORDS, metadata=check(ge=1))
    max_retry_seconds: float = field(default=DEFAULT_MAX_RETRY_SECONDS, metadata=check(ge=0))
    timeout_seconds: float = field(default=DEFAULT_TIMEOUT_SECONDS, metadata=check(ge=0))
    shutdown_seconds: float = field(default=DEFAULT_SHUTDOWN_SECONDS, metadata=check(ge=0))
    progress_seconds: float = field(default=DEFAULT_PROGRESS_SECONDS, metadata=check(gt=0))
    source_id: str = field(default_factory=default_source_id, metadata=check(non_empty=True))

    def validate(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError("forward_records", f"must be an http(s) URL, not {self.url!r}")
        validate_fields(self, "forward_records")


@dataclass(frozen=True, slots=True)
class _Body:
    """A batch as it is posted (encoded once, sent again as it is on a retry)."""

    body: bytes
    records: int
    progress: int


Item: TypeAlias = RequestRecord | OutgoingProgress | OutgoingPricedPart


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


class RecordForwarder:
    """A RecordSink that exports records as OTLP logs from its sender's thread."""

    def __init__(self, config: ForwarderConfig, stats: CollectorStats | None = None,
                 auth_token: str | None = None,
                 client: httpx.Client | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 progress: ForwardProgress | None = None) -> None:
        """``progress``: this replica's per-unit progress (the service gives it the floor
        of what the replica still holds); default: from the records alone."""
        config.validate()
        self._config = config
        self._progress = progress or ForwardProgress(AttributorConfig().lateness_bounds)
        self._stats = stats or CollectorStats()
        headers = {"Content-Type": PROTOBUF}
        if auth_token:
            headers["Authorization"] = f"Bearer {auth_token}"
        self._client = client or httpx.Client(timeout=config.timeout_seconds)
        self._headers = headers
        self._sender: BatchSender[Item, _Body] = BatchSender(
            "forwarder",
            SenderConfig(config.max_queue_records, config.batch_records,
                         config.max_retry_seconds, config.shutdown_seconds),
            self._encode, self._export, self._dropped, clock)
        self._finished = False

    @property
    def source_id(self) -> str:
        return self._config.source_id

    # --- RecordSink ----------------------------------------------------------------------

    def consume_record(self, record: RequestRecord) -> None:
        self._progress.observe(record)
        self._sender.put(record)

    def consume_priced_part(self, part: RequestRecord) -> None:
        """A disaggregated record's prefill part, priced here, for the collector that
        prices its decode (the decode engine's unit; collector/cost/disaggregated_parts.py).
        Not a record of any unit's progress: it is merged there, not priced."""
        self._sender.put(OutgoingPricedPart(part))

    # --- Ticking (the pipeline thread) -----------------------------------------------------

    @property
    def tick_seconds(self) -> float:
        return self._config.progress_seconds

    def tick(self) -> None:
        """Queue this replica's progress for every unit it forwards, behind its records."""
        for mark in self._progress.marks():
            self._sender.put(mark)

    def consume_idle_cost(self, idle: IdleCost) -> None:
        """Nothing is priced here: idle cost is the pricing collector's."""

    def backlog(self) -> Backlog:
        """Records queued or being sent, as admission sees them: past half of
        ``max_queue_records`` the receivers shed load."""
        return self._sender.backlog()

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self._sender.start()

    def begin_shutdown(self) -> None:
        """The collector is stopping: the flush deadline (``shutdown_seconds``) runs from
        now, so a peer that takes nothing cannot hold the shutdown longer."""
        self._sender.begin_shutdown()

    def shutdown(self) -> None:
        """Send what is queued and each unit's final progress, until the flush deadline;
        count the rest. Idempotent."""
        if not self._finished:
            self._finished = True
            for mark in self._progress.marks(final=True):
                self._sender.put(mark)
        self._sender.shutdown()
        self._client.close()

    # --- the sender's side ---------------------------------------------------------------

    def _encode(self, items: list[Item]) -> _Body:
        records = sum(1 for item in items if not isinstance(item, OutgoingProgress))
        body = encode_records(items, self._config.source_id, time.time())
        return _Body(body.SerializeToString(), records, len(items) - records)

    def _dropped(self, reason: str, items: Sequence[Item]) -> None:
        records = sum(1 for item in items if not isinstance(item, OutgoingProgress))
        if records:
            self._stats.records_forward_dropped.inc(reason, records)

    def _export(self, batch: _Body) -> None:
        """One POST of the batch; counts what the receiver took and refused."""
        try:
            response = self._client.post(self._config.url, content=batch.body,
                                         headers=self._headers)
        except httpx.HTTPError as exc:
            raise Retry(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code in RETRYABLE_STATUSES:
            raise Retry(f"HTTP {response.status_code}", _retry_after(response))
        if response.status_code != 200:
            raise GiveUp(f"{self._config.url} answered HTTP {response.status_code}")
        parsed = ExportLogsServiceResponse()
        try:
            parsed.ParseFromString(response.content)
        except Exception:  # protobuf raises DecodeError; a 200 took the data
            parsed.Clear()
        rejected = int(parsed.partial_success.rejected_log_records)
        if rejected:
            log.warning("forwarder: %d log records refused: %s", rejected,
                        parsed.partial_success.error_message)
            self._stats.records_forward_dropped.inc(DROP_REJECTED, min(rejected, batch.records))
        self._stats.records_forwarded.inc(max(0, batch.records - rejected))
        self._stats.progress_forwarded.inc(batch.progress)
