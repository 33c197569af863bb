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
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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
from tokenpath.collector.record_logs import encode_records
from tokenpath.collector.stats import CollectorStats
from tokenpath.config import ConfigError
from tokenpath.records import IdleCost, RequestRecord

log = logging.getLogger(__name__)

DEFAULT_MAX_QUEUE_RECORDS = 100_000
DEFAULT_BATCH_RECORDS = 512
DEFAULT_MAX_RETRY_SECONDS = 300.0
DEFAULT_TIMEOUT_SECONDS = 10.0
DEFAULT_SHUTDOWN_SECONDS = 30.0
RETRYABLE_STATUSES = frozenset({429, 502, 503, 504})
PROTOBUF = "application/x-protobuf"


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


@dataclass(frozen=True, slots=True)
class _Body:
    """A batch as it is posted (encoded once, sent again as it is on a retry)."""

    body: bytes
    records: int


def _encode(records: list[RequestRecord]) -> _Body:
    return _Body(encode_records(records).SerializeToString(), len(records))


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
                 clock: Callable[[], float] = time.monotonic) -> None:
        config.validate()
        self._config = config
        self._stats = stats or CollectorStats()
        headers = {"Content-Type": PROTOBUF}
        if auth_token:
            headers["Authorization"] = f"Bearer {auth_token}"
        self._client = client or httpx.Client(timeout=config.timeout_seconds)
        self._headers = headers
        self._sender: BatchSender[RequestRecord, _Body] = BatchSender(
            "forwarder",
            SenderConfig(config.max_queue_records, config.batch_records,
                         config.max_retry_seconds, config.shutdown_seconds),
            _encode, self._export, self._dropped, clock)

    # --- RecordSink ----------------------------------------------------------------------

    def consume_record(self, record: RequestRecord) -> None:
        self._sender.put(record)

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
        """Send what is queued, until the flush deadline; count the rest. Idempotent."""
        self._sender.shutdown()
        self._client.close()

    # --- the sender's side ---------------------------------------------------------------

    def _dropped(self, reason: str, records: Sequence[RequestRecord]) -> None:
        self._stats.records_forward_dropped.inc(reason, len(records))

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
            log.warning("forwarder: %d records refused: %s", rejected,
                        parsed.partial_success.error_message)
            self._stats.records_forward_dropped.inc(DROP_REJECTED, rejected)
        self._stats.records_forwarded.inc(batch.records - rejected)
