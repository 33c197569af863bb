"""Wires the pipeline: receivers -> assembler -> mapper -> attributor -> sinks.

Start order is sinks first, receivers last; shutdown is the reverse, and flushes: the
receivers stop taking data, the assembler hands every buffered trace on, the attributor
and the store write what they hold.
"""

from __future__ import annotations

import logging
from typing import Protocol

from prometheus_client import CollectorRegistry

from tokenpath.collector.assembler import Assembler
from tokenpath.collector.config import CollectorConfig
from tokenpath.collector.cost.attributor import CostAttributor
from tokenpath.collector.cost.prices import PriceSheet, load_price_sheet
from tokenpath.collector.http_app import HttpListener, build_app
from tokenpath.collector.mapping import StageMapper
from tokenpath.collector.node_metrics import NodeMetricsState
from tokenpath.collector.prometheus_sink import PrometheusSink
from tokenpath.collector.receivers.grpc import GrpcReceiver
from tokenpath.collector.receivers.ingest import OtlpIngest
from tokenpath.collector.stats import CollectorStats
from tokenpath.collector.store import RecordStore, StoreConfig
from tokenpath.pipeline import FanOut, IdleCost, RecordSink
from tokenpath.records import RequestRecord

log = logging.getLogger(__name__)


class Attributor(Protocol):
    def start(self) -> None: ...

    def consume_record(self, record: RequestRecord) -> None: ...

    def consume_idle_cost(self, idle: IdleCost) -> None: ...

    def shutdown(self) -> None: ...


def build_attributor(downstream: RecordSink, config: CollectorConfig,
                     prices: PriceSheet) -> Attributor:
    """The cost attributor in front of the sinks: dollars per stage, idle cost per pool."""
    return CostAttributor(downstream, prices, config=config.cost)


class CollectorService:
    def __init__(self, config: CollectorConfig, registry: CollectorRegistry | None = None) -> None:
        config.validate()
        self.config = config
        self.stats = CollectorStats()
        self.registry = registry if registry is not None else CollectorRegistry()
        self.store = RecordStore(
            StoreConfig(path=config.store_path, retention_seconds=config.retention_seconds),
            self.stats,
        )
        self.prometheus = PrometheusSink(self.registry, self.stats,
                                         max_models=config.limits.max_label_values,
                                         max_pools=config.limits.max_label_values,
                                         max_statuses=config.limits.max_label_values)
        self.node_metrics = NodeMetricsState()
        sinks = FanOut([self.prometheus, self.store])
        self.prices = load_price_sheet(config.prices_path)
        self.attributor = build_attributor(sinks, config, self.prices)
        self.mapper = StageMapper(self.attributor, self.stats)
        self.assembler = Assembler(self.mapper, config.assembler, self.stats)
        self.ingest = OtlpIngest(self.assembler, self.node_metrics, config.limits, self.stats,
                                 config.max_buffered_spans)
        self.app = build_app(self.ingest, self.store, self.prometheus.render, self.stats,
                             self.prices, config.auth_token)
        self.http = HttpListener(self.app, config.http_host, config.http_port, config.tls)
        self.grpc: GrpcReceiver | None = None
        if config.grpc_port is not None:
            self.grpc = GrpcReceiver(self.ingest, self.stats, config.grpc_host, config.grpc_port,
                                     config.auth_token, config.limits.max_body_bytes,
                                     config.tls)
        self._started = False
        self._stopped = False

    @property
    def http_url(self) -> str:
        return self.http.url

    @property
    def grpc_endpoint(self) -> str | None:
        return self.grpc.endpoint if self.grpc else None

    def start(self) -> None:
        if self._started:
            return
        self._started = True
        config = self.config
        log.debug("collector: store %s, retention %s s, bearer auth %s, max buffered spans %d",
                  config.store_path, config.retention_seconds,
                  "on" if config.auth_token else "off", config.max_buffered_spans)
        self.store.start()
        self.attributor.start()
        self.assembler.start()
        try:
            if self.grpc is not None:
                self.grpc.start()
            self.http.start()
        except BaseException:  # a listener could not start: stop what did, then report
            self.shutdown()
            raise
        log.info("collector listening: http %s grpc %s", self.http_url, self.grpc_endpoint)

    def shutdown(self) -> None:
        """Stop receiving, flush every buffered trace into the store. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self.http.shutdown()
        if self.grpc is not None:
            self.grpc.shutdown()
        self.assembler.shutdown()  # flushes -> mapper -> attributor -> sinks (store closes)
