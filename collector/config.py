"""Collector configuration: one dataclass, named defaults, errors that name the key.

Precedence: argument > environment > file > default (``tokenpath.config.resolve``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenpath.collector.assembler import AssemblerConfig
from tokenpath.collector.backpressure import high_water
from tokenpath.collector.call_join import JoinConfig
from tokenpath.collector.cost.attributor import AttributorConfig
from tokenpath.collector.forwarder import ForwarderConfig
from tokenpath.collector.gc_tuning import DEFAULT_GC_YOUNG_THRESHOLD
from tokenpath.collector.limits import IngestLimits
from tokenpath.collector.pipeline_worker import DEFAULT_SHED_AT
from tokenpath.collector.receivers.ingest import DEFAULT_MAX_BUFFERED_SPANS
from tokenpath.collector.store.base import DEFAULT_QUEUE_SIZE as DEFAULT_STORE_QUEUE_SIZE
from tokenpath.collector.store.base import DEFAULT_RETENTION_SECONDS
from tokenpath.collector.store.url import ENV_STORE, default_store_path
from tokenpath.config import (
    ConfigError,
    check,
    parse_duration,
    parse_host_port,
    read_section,
    resolve,
    typed_value,
    validate_fields,
)
from tokenpath.endpoints import COLLECTOR_GRPC, COLLECTOR_GRPC_PORT, COLLECTOR_HTTP_PORT, LOOPBACK
from tokenpath.slo import CONFIG_KEY as SLO_CONFIG_KEY
from tokenpath.slo import SloConfig
from tokenpath.tls import TlsConfig

log = logging.getLogger(__name__)

DEFAULT_HTTP_HOST = LOOPBACK
DEFAULT_HTTP_PORT = COLLECTOR_HTTP_PORT
DEFAULT_HTTP = f"{DEFAULT_HTTP_HOST}:{DEFAULT_HTTP_PORT}"
DEFAULT_GRPC = COLLECTOR_GRPC
ENV_HTTP = "TOKENPATH_COLLECTOR_HTTP"
ENV_GRPC = "TOKENPATH_COLLECTOR_GRPC"
ENV_PRICES = "TOKENPATH_PRICES"
ENV_AUTH_TOKEN = "TOKENPATH_AUTH_TOKEN"
ENV_FORWARD_RECORDS = "TOKENPATH_FORWARD_RECORDS"
# The keys a collector config file may hold (docs/operations.md); "agent" is the node
# agent's section of a file both read, which the collector leaves alone.
FILE_KEYS = frozenset({"http", "grpc", "store", "prices", "retention", "max_buffered_spans",
                       "assembler", "cost", "limits", "tls", "agent", "forward_records",
                       "pipeline_shed_at", "pipeline_queue_size", "store_queue_size",
                       "store_batch_size", "join", "gc_young_threshold", SLO_CONFIG_KEY})


def _port(key: str, *, optional: bool = False) -> Mapping[str, Any]:
    return check(ge=0, le=65535, optional=optional, key=key,
                 message="port out of range: {value}")


@dataclass(frozen=True, slots=True)
class CollectorConfig:
    http_host: str = DEFAULT_HTTP_HOST
    http_port: int = field(default=DEFAULT_HTTP_PORT, metadata=_port("http"))
    grpc_host: str = LOOPBACK
    grpc_port: int | None = field(default=COLLECTOR_GRPC_PORT,  # None: no gRPC listener
                                  metadata=_port("grpc", optional=True))
    store_path: str = ":memory:"
    prices_path: str | None = None
    retention_seconds: float = field(default=DEFAULT_RETENTION_SECONDS,
                                     metadata=check(gt=0, key="retention"))
    max_buffered_spans: int = field(default=DEFAULT_MAX_BUFFERED_SPANS, metadata=check(ge=1))
    auth_token: str | None = field(default=None, repr=False)
    assembler: AssemblerConfig = field(default_factory=AssemblerConfig)
    cost: AttributorConfig = field(default_factory=AttributorConfig)
    limits: IngestLimits = field(default_factory=IngestLimits)
    tls: TlsConfig = field(default_factory=TlsConfig)
    # An OTLP/HTTP logs URL: export mapped records there for pricing instead of pricing
    # them here (the second hop of a sharded deployment, docs/deploy.md).
    forward_records: str | None = None
    # Traces and record batches waiting for the pipeline worker from which the receivers
    # shed load (its queue is unbounded; admission bounds it). The old key
    # pipeline_queue_size (twice this) is still read.
    pipeline_shed_at: int = field(default=DEFAULT_SHED_AT, metadata=check(ge=1))
    # Records (and idle-cost slices) waiting for the store's writer: past half of it the
    # receivers shed load; when full, the pipeline worker waits (never a drop).
    store_queue_size: int = field(default=DEFAULT_STORE_QUEUE_SIZE, metadata=check(ge=1))
    # Records the store's writer writes in one transaction or insert, at most; None: the
    # store's default (500 for SQLite, 5,000 for ClickHouse).
    store_batch_size: int | None = field(default=None, metadata=check(ge=1, optional=True))
    join: JoinConfig = field(default_factory=JoinConfig)
    # The garbage collector's young threshold in the collector process (gc_tuning.py);
    # 0 keeps Python's default.
    gc_young_threshold: int = field(default=DEFAULT_GC_YOUNG_THRESHOLD, metadata=check(
        ge=0, message="must be >= 0 (0: Python's default)"))
    # SLO classes (tokenpath/slo.py), the file's slo_classes: records are classified as
    # they are mapped, so every replica of a sharded deployment needs the same ones.
    slo: SloConfig = field(default_factory=SloConfig)

    @property
    def forwarder(self) -> ForwarderConfig | None:
        return None if self.forward_records is None else ForwarderConfig(self.forward_records)

    def validate(self) -> None:
        validate_fields(self)  # top-level keys: no section
        if self.prices_path is not None and not Path(self.prices_path).is_file():
            raise ConfigError("prices", f"no such file: {self.prices_path}")
        if self.forwarder is not None:
            self.forwarder.validate()
        self.assembler.validate()
        self.join.validate()
        self.cost.validate()
        self.limits.validate()
        self.tls.validate()
        self.slo.validate()

    @classmethod
    def from_sources(
        cls,
        *,
        http: str | None = None,
        grpc: str | None = None,
        store: str | None = None,
        prices: str | None = None,
        auth_token: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_client_ca: str | None = None,
        forward_records: str | None = None,
        file: dict[str, Any] | None = None,
    ) -> CollectorConfig:
        """Arguments win over TOKENPATH_* variables, which win over the file's keys."""
        f = file or {}
        for key in f:
            if key not in FILE_KEYS:
                raise ConfigError(key, f"unknown key; known: {', '.join(sorted(FILE_KEYS))}")
        http_value = resolve("http", http, ENV_HTTP, f, DEFAULT_HTTP, str)
        grpc_value = resolve("grpc", grpc, ENV_GRPC, f, DEFAULT_GRPC, str)
        http_host, http_port = parse_host_port(http_value, "http")
        grpc_port: int | None
        if grpc_value.lower() in ("", "off", "none"):
            grpc_host, grpc_port = LOOPBACK, None
        else:
            grpc_host, grpc_port = parse_host_port(grpc_value, "grpc")
        store_path = resolve("store", store, ENV_STORE, f, default_store_path(), str)
        prices_path = resolve("prices", prices, ENV_PRICES, f, None, str)
        retention = resolve("retention", None, None, f, DEFAULT_RETENTION_SECONDS,
                            lambda v: parse_duration(v, "retention"))
        token = auth_token if auth_token is not None else (os.environ.get(ENV_AUTH_TOKEN) or None)
        assembler = read_section(AssemblerConfig, f, "assembler")
        cost = read_section(AttributorConfig, f, "cost")
        limits = read_section(IngestLimits, f, "limits")
        join = read_section(JoinConfig, f, "join")
        read_section(TlsConfig, f, "tls")  # a mapping with known keys only
        tls_file = {f"tls.{k}": v for k, v in (f.get("tls") or {}).items() if v is not None}
        tls = TlsConfig.from_sources(tls_cert, tls_key, tls_client_ca, tls_file)
        max_buffered = resolve("max_buffered_spans", None, None, f, DEFAULT_MAX_BUFFERED_SPANS,
                               lambda v: typed_value("max_buffered_spans", "int", v))
        forward = resolve("forward_records", forward_records, ENV_FORWARD_RECORDS, f, None,
                          str) or None
        shed_at = _pipeline_shed_at(f)
        store_queue = resolve("store_queue_size", None, None, f, DEFAULT_STORE_QUEUE_SIZE,
                              lambda v: typed_value("store_queue_size", "int", v))
        store_batch = resolve("store_batch_size", None, None, f, None,
                              lambda v: typed_value("store_batch_size", "int", v))
        gc_young = resolve("gc_young_threshold", None, None, f, DEFAULT_GC_YOUNG_THRESHOLD,
                           lambda v: typed_value("gc_young_threshold", "int", v))
        config = cls(
            http_host=http_host, http_port=http_port, grpc_host=grpc_host, grpc_port=grpc_port,
            store_path=store_path, prices_path=prices_path, retention_seconds=retention,
            max_buffered_spans=max_buffered, auth_token=token, assembler=assembler, cost=cost,
            limits=limits, tls=tls, forward_records=forward, pipeline_shed_at=shed_at,
            store_queue_size=store_queue, store_batch_size=store_batch,
            join=join, gc_young_threshold=gc_young,
            slo=SloConfig.from_file(f.get(SLO_CONFIG_KEY)),
        )
        config.validate()
        return config


def _pipeline_shed_at(file: dict[str, Any]) -> int:
    """``pipeline_shed_at``; from the old key ``pipeline_queue_size`` (the receivers shed
    at half of it), with a warning, where only that is given."""
    if "pipeline_shed_at" in file and "pipeline_queue_size" in file:
        raise ConfigError("pipeline_queue_size", "the old name of pipeline_shed_at (twice "
                          "it); give pipeline_shed_at only")
    if "pipeline_queue_size" in file:
        size = typed_value("pipeline_queue_size", "int", file["pipeline_queue_size"])
        log.warning("config: pipeline_queue_size is read as pipeline_shed_at: %d (half of "
                    "it); rename the key", high_water(size))
        return high_water(size)
    return int(resolve("pipeline_shed_at", None, None, file, DEFAULT_SHED_AT,
                       lambda v: typed_value("pipeline_shed_at", "int", v)))
