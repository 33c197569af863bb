"""Wires the pipeline: receivers -> assembler -> [worker: mapper -> call joiner ->
attributor -> sinks].

Everything after the assembler runs on one thread (:mod:`.pipeline_worker`). With
``forward_records`` the mapper's downstream is the :class:`RecordForwarder` instead of the
attributor (records are priced by the collector the router sends them to); every
collector prices the record logs it receives on ``/v1/logs`` (HTTP and gRPC) through its
attributor and sinks.

Start order is sinks first, receivers last; shutdown is the reverse, and flushes: the
receivers stop taking data, the assembler hands every buffered trace on, the worker
drains its queue, the forwarder sends what it holds, the attributor and the store write
what they hold.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry

from tokenpath.build_metrics import BuildInfoCollector
from tokenpath.collector.assembler import Assembler
from tokenpath.collector.backpressure import Backlog
from tokenpath.collector.call_join import CallJoiner
from tokenpath.collector.config import CollectorConfig
from tokenpath.collector.cost.attributor import CostAttributor
from tokenpath.collector.cost.disaggregated_parts import (
    ForwardedParts,
    PartMerger,
    PartSplitter,
    split_parts,
)
from tokenpath.collector.cost.energy import GpuEnergyReadings
from tokenpath.collector.cost.prices import PriceSheet, load_price_sheet
from tokenpath.collector.fan_out import FanOut
from tokenpath.collector.forward_progress import ForwardProgress
from tokenpath.collector.forwarder import RecordForwarder
from tokenpath.collector.http_app import HttpListener, build_app
from tokenpath.collector.interfaces import RecordSink, Ticking
from tokenpath.collector.mapping import StageMapper
from tokenpath.collector.node_metrics import NodeMetricsState
from tokenpath.collector.pipeline_worker import PipelineWorker
from tokenpath.collector.prometheus_sink import PrometheusSink
from tokenpath.collector.receivers.grpc import GrpcReceiver
from tokenpath.collector.receivers.ingest import OtlpIngest
from tokenpath.collector.stats import CollectorStats
from tokenpath.collector.store.base import StoreConfig
from tokenpath.collector.store.factory import make_store
from tokenpath.compiled import describe as describe_compiled_core
from tokenpath.install_check import build_state, log_fallbacks
from tokenpath.records import IdleCost, RequestRecord

log = logging.getLogger(__name__)


def build_attributor(downstream: RecordSink, config: CollectorConfig,
                     prices: PriceSheet, energy: GpuEnergyReadings | None = None
                     ) -> CostAttributor:
    """The cost attributor in front of the sinks: dollars and joules per stage, idle cost
    per pool."""
    return CostAttributor(downstream, prices, config=config.cost, energy=energy)


class CollectorService:
    def __init__(self, config: CollectorConfig, registry: CollectorRegistry | None = None) -> None:
        config.validate()
        self.config = config
        self.stats = CollectorStats()
        self.registry = registry if registry is not None else CollectorRegistry()
        self.build = build_state()
        self.registry.register(BuildInfoCollector(self.build))
        self.store = make_store(
            StoreConfig(path=config.store_path, retention_seconds=config.retention_seconds,
                        queue_size=config.store_queue_size,
                        batch_size=config.store_batch_size),
            self.stats,
        )
        self.prometheus = PrometheusSink(self.registry, self.stats,
                                         max_models=config.limits.max_label_values,
                                         max_pools=config.limits.max_label_values,
                                         max_statuses=config.limits.max_label_values,
                                         slo=config.slo)
        self.energy = GpuEnergyReadings()
        self.node_metrics = NodeMetricsState(downstream=[self.energy])
        sinks = FanOut([self.prometheus, self.store])
        self.prices = load_price_sheet(config.prices_path)
        # a disaggregated record is priced as its prefill and decode parts, each on its
        # engine's unit, and merged again behind the attributor
        self.forwarder: RecordForwarder | None = None
        if config.forwarder is not None:
            progress = ForwardProgress(config.cost.lateness_bounds, self._held_floor)
            self.forwarder = RecordForwarder(config.forwarder, self.stats, config.auth_token,
                                             progress=progress)
        # sharded, a prefill part priced here goes on to its decode's collector
        self.parts = PartMerger(sinks, None if self.forwarder is None
                                else self.forwarder.consume_priced_part)
        self.attributor = build_attributor(self.parts, config, self.prices, self.energy)
        for holder in (sinks.telemetry, self.attributor.stats, self.energy.stats):
            self.prometheus.export_telemetry(holder)
        mapped: RecordSink = PartSplitter(self.attributor, self.parts)
        tickers: list[Ticking] = []
        if self.forwarder is not None:
            mapped = _ForwardThenClose(self.forwarder, self.attributor)
        self.joiner = CallJoiner(mapped, config.join, self.stats, slo=config.slo)
        self.mapper = StageMapper(self.joiner, self.stats, config.slo)
        self.prometheus.export_telemetry(self.mapper.engine_steps)
        # the forwarder ticks after the joiner: its progress covers what the joiner holds
        tickers.append(self.joiner)
        if self.forwarder is not None:
            tickers.append(self.forwarder)
        tickers.extend((self.attributor, self.parts))
        self.worker = PipelineWorker(self.mapper, ForwardedParts(self.attributor, self.parts),
                                     tickers, self.stats,
                                     shed_at=config.pipeline_shed_at,
                                     track_starts=self.forwarder is not None,
                                     stepped=(self.attributor,),
                                     records_per_step=config.cost.max_records_per_step)
        self.assembler = Assembler(self.worker, config.assembler, self.stats)
        # Admission (collector/backpressure.py): the receivers refuse while any stage a
        # span or record still has to pass is past its high-water mark.
        assembler = self.assembler
        span_backlogs = [Backlog("assembler buffered spans", lambda: assembler.spans_buffered,
                                 config.max_buffered_spans)]
        record_backlogs = [self.worker.backlog(), self.store.backlog()]
        if self.forwarder is not None:
            record_backlogs.append(self.forwarder.backlog())
        self.ingest = OtlpIngest(self.assembler, self.node_metrics, config.limits, self.stats,
                                 span_backlogs, records=self.worker,
                                 record_backlogs=record_backlogs)
        self.app = build_app(self.ingest, self.store, self.prometheus.render, self.stats,
                             self.prices, config.auth_token, config.forward_records,
                             self.node_metrics, slo=config.slo)
        self.http = HttpListener(self.app, config.http_host, config.http_port, config.tls)
        self.grpc: GrpcReceiver | None = None
        if config.grpc_port is not None:
            self.grpc = GrpcReceiver(self.ingest, self.stats, config.grpc_host, config.grpc_port,
                                     config.auth_token, config.limits.max_body_bytes,
                                     config.tls)
        self._started = False
        self._stopped = False

    def _held_floor(self) -> float:
        """The earliest start of what this replica holds that may still become a record
        (collector/forward_progress.py): the assembler's traces, then the pipeline queue
        (read in that order, so a trace handed between them is seen), then the joiner's
        held records. Called on the pipeline thread."""
        earliest = self.assembler.earliest_start_unix()
        queued = self.worker.queued_starts
        if queued is not None:
            earliest = min(earliest, queued.earliest())
        return min(earliest, self.joiner.earliest_held_start())

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
        if self.forwarder is not None:
            self.forwarder.start()
        self.worker.start()
        self.assembler.start()
        try:
            if self.grpc is not None:
                self.grpc.start()
            self.http.start()
            self.store.announce_api(self.http_url)
        except BaseException:  # a listener could not start: stop what did, then report
            self.shutdown()
            raise
        log.info("collector listening: http %s grpc %s; %s; per-request core: %s",
                 self.http_url, self.grpc_endpoint, self.build.describe(),
                 describe_compiled_core())
        log_fallbacks(self.build, "collector")

    def shutdown(self) -> None:
        """Stop receiving, flush every buffered trace into the store. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self.http.shutdown()
        if self.grpc is not None:
            self.grpc.shutdown()
        if self.forwarder is not None:  # its flush deadline runs from here
            self.forwarder.begin_shutdown()
        # flushes -> worker -> mapper -> forwarder/attributor -> sinks (store closes)
        self.assembler.shutdown()


class _ForwardThenClose:
    """The mapper's downstream on a forwarding replica: records go to the forwarder (a
    disaggregated one also as its prefill part, for the prefill engine's unit); at
    shutdown the attributor (which priced only the records other replicas forwarded here)
    flushes and its sinks close, then the forwarder sends what it holds: the prefill parts
    priced in that flush among it."""

    def __init__(self, forwarder: RecordForwarder, attributor: CostAttributor) -> None:
        self._forwarder = forwarder
        self._attributor = attributor

    def consume_record(self, record: RequestRecord) -> None:
        parts = split_parts(record)
        if parts is not None:  # its prefill is priced on the prefill engine's unit
            self._forwarder.consume_record(parts[0])
        self._forwarder.consume_record(record)

    def consume_idle_cost(self, idle: IdleCost) -> None:
        self._forwarder.consume_idle_cost(idle)

    def shutdown(self) -> None:
        self._attributor.shutdown()
        self._forwarder.shutdown()
