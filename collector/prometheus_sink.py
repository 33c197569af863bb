"""Prometheus exposition of request records and collector self-telemetry.

A sink: it consumes finished RequestRecords and IdleCost slices and owns its metrics
(never the global registry). Metric names and labels come from tokenpath.metric_names.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tokenpath import metric_names as M
from tokenpath.collector.cost.energy import ENERGY_MEASURED
from tokenpath.collector.disaggregated import kv_link
from tokenpath.collector.exposition import CounterChild, FastCounter, FastHistogram, render
from tokenpath.collector.stats import CollectorStats
from tokenpath.labels import BoundedLabel
from tokenpath.leaks import MissCause, context_bucket_index, context_bucket_labels, context_tokens
from tokenpath.records import IdleCost, RequestRecord
from tokenpath.slo import OUTCOME_UNKNOWN, OUTCOMES, SloConfig
from tokenpath.stages import GPU_STAGES, PLAIN_VALUES, StageId
from tokenpath.telemetry import Count, CountsRead, Instrument, Level, Telemetry

MISS_CAUSE_VALUES = frozenset(cause.value for cause in MissCause)
SLO_OUTCOMES = frozenset(OUTCOMES)

DEFAULT_MAX_MODELS = 50
DEFAULT_MAX_POOLS = 50
DEFAULT_MAX_STATUSES = 50
DEFAULT_MAX_TENANTS = 200
DEFAULT_MAX_SLO_CLASSES = 50

STAGE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0,
                60.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0)
SMALL_CHUNK_LABEL = M.CHUNK_SIZE_SMALL


class PrometheusSink:
    """Turns records into the SPEC metrics.

    Request metrics live in :mod:`tokenpath.collector.exposition` (fast to scrape); the
    collector's self-telemetry is a custom collector on ``registry``, which this sink owns
    when none is given. :meth:`render` returns the whole /metrics text.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        stats: CollectorStats | None = None,
        max_models: int = DEFAULT_MAX_MODELS,
        max_pools: int = DEFAULT_MAX_POOLS,
        max_statuses: int = DEFAULT_MAX_STATUSES,
        max_tenants: int = DEFAULT_MAX_TENANTS,
        slo: SloConfig | None = None,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._stats = stats or CollectorStats()
        self._model = BoundedLabel(max_models, M.LABEL_MODEL)
        self._pool = BoundedLabel(max_pools, M.LABEL_POOL)
        self._status = BoundedLabel(max_statuses, M.LABEL_STATUS)
        self._tenant = BoundedLabel(max_tenants, M.LABEL_TENANT)
        self.requests = FastCounter(M.REQUESTS)
        self.stage_duration = FastHistogram(M.STAGE_DURATION, STAGE_BUCKETS)
        self.ttft = FastHistogram(M.TTFT, TTFT_BUCKETS)
        self.tpot = FastHistogram(M.TPOT, TPOT_BUCKETS)
        self.tokens = FastCounter(M.TOKENS)
        self.cost = FastCounter(M.COST)
        self.idle_cost = FastCounter(M.IDLE_COST)
        self.idle_reclaimed = FastCounter(M.IDLE_COST_RECLAIMED)
        self.cache_miss_waste = FastCounter(M.CACHE_MISS_WASTE)
        self.naive_cost = FastCounter(M.NAIVE_COST)
        self.response_chunks = FastCounter(M.RESPONSE_CHUNKS)
        self.context_cost = FastCounter(M.LONG_CONTEXT_COST)
        self.router_cache = FastCounter(M.ROUTER_CACHE_PREDICTION)
        self.miss_dollars = FastCounter(M.CACHE_MISS_DOLLARS)
        self.tenant_cost = FastCounter(M.TENANT_COST)
        self.energy = FastCounter(M.ENERGY)
        self.idle_energy = FastCounter(M.IDLE_ENERGY)
        self.energy_measured = FastCounter(M.ENERGY_MEASURED)
        self.tenant_requests = FastCounter(M.TENANT_REQUESTS)
        self.miss_tokens = FastCounter(M.CACHE_MISS_TOKENS)
        self.slo_requests = FastCounter(M.SLO_REQUESTS)
        self.slo_dollars = FastCounter(M.SLO_DOLLARS)
        # Records come classified (by this replica's mapper or a forwarding one's).
        self._slo = BoundedLabel(DEFAULT_MAX_SLO_CLASSES, M.LABEL_SLO)
        self._slo_models: set[tuple[str, str]] = set()  # (class, model) pairs with series
        self.kv_transfer_bytes = FastCounter(M.KV_TRANSFER_BYTES)
        self._context_buckets = context_bucket_labels()
        # model label -> stage -> its series, looked up once (the model label is bounded)
        self._stage_series: dict[str, dict[StageId, _StageSeries]] = {}
        self._families: list[FastCounter | FastHistogram] = [
            self.requests, self.stage_duration, self.ttft, self.tpot, self.tokens, self.cost,
            self.idle_cost, self.idle_reclaimed, self.cache_miss_waste, self.naive_cost,
            self.response_chunks,
            self.context_cost, self.router_cache, self.miss_dollars, self.miss_tokens,
            self.tenant_cost, self.tenant_requests, self.energy, self.idle_energy,
            self.energy_measured, self.slo_requests, self.slo_dollars, self.kv_transfer_bytes,
        ]
        labels = (self._model, self._pool, self._status, self._tenant, self._slo)
        self.telemetry = TelemetryExporter([self._stats, _LabelTelemetry(labels)])
        self.registry.register(self.telemetry)
        if slo is not None and slo.classes:
            self.registry.register(SloConfigCollector(slo))

    def export_telemetry(self, holder: Telemetry) -> None:
        """Write ``holder``'s instruments on /metrics too (a component built later)."""
        self.telemetry.add(holder)

    def consume_record(self, record: RequestRecord) -> None:
        model = self._model(record.model)
        self.requests.labels(model, self._status(record.status)).inc()
        stage_series = self._stage_series.get(model)
        if stage_series is None:
            stage_series = self._stage_series[model] = {}
        for timing in record.ordered_stages():
            series = stage_series.get(timing.stage)
            if series is None:
                series = stage_series[timing.stage] = _StageSeries(
                    self.stage_duration, self.cost, self.energy, PLAIN_VALUES[timing.stage],
                    model)
            series.duration.observe(timing.seconds)
            if timing.phases:
                booked = 0.0
                for phase, share in timing.phases.items():
                    dollars = share.cost_dollars
                    booked += dollars
                    if dollars > 0:
                        series.cost(PLAIN_VALUES[phase]).inc(dollars)
                rest = timing.cost_dollars - booked
                if rest > 1e-15:
                    series.cost(M.PHASE_NONE).inc(rest)
            else:  # a zero-cost stage (the scheduler queue) still gets its series, at 0
                series.cost(M.PHASE_NONE).inc(max(0.0, timing.cost_dollars))
        if record.ttft_seconds is not None:
            self.ttft.labels(model).observe(record.ttft_seconds)
        if record.tpot_seconds is not None:
            self.tpot.labels(model).observe(record.tpot_seconds)
        self.tokens.labels(model, M.TOKEN_KIND_INPUT).inc(record.input_tokens)
        self.tokens.labels(model, M.TOKEN_KIND_CACHE_READ).inc(record.cache_read_tokens)
        self.tokens.labels(model, M.TOKEN_KIND_OUTPUT).inc(record.output_tokens)
        self.cache_miss_waste.labels(model).inc(max(0.0, record.cache_miss_waste_dollars))
        self.naive_cost.labels(model).inc(max(0.0, record.naive_cost_dollars))
        if record.kv_transfer_bytes:  # a disaggregated request's KV, prefill to decode
            self.kv_transfer_bytes.labels(model, kv_link(record)).inc(record.kv_transfer_bytes)
        if record.energy_joules > 0:  # split over the GPU stages as their dollars are
            gpu_dollars = record.gpu_cost_dollars
            for stage_id in GPU_STAGES:
                gpu_timing = record.stages.get(stage_id)
                if gpu_timing is None or gpu_dollars <= 0:
                    continue
                per_dollar = record.energy_joules / gpu_dollars
                series = stage_series[stage_id]  # written above: the record has the stage
                booked = 0.0
                for phase, share in gpu_timing.phases.items():
                    if share.cost_dollars > 0:
                        series.energy(PLAIN_VALUES[phase]).inc(share.cost_dollars * per_dollar)
                        booked += share.cost_dollars
                rest = gpu_timing.cost_dollars - booked  # as the cost metric books it
                if rest > 1e-15:
                    series.energy(M.PHASE_NONE).inc(rest * per_dollar)
            if record.energy_provenance == ENERGY_MEASURED:
                self.energy_measured.labels(model).inc(record.energy_joules)
        tenant = self._tenant(record.tenant or M.TENANT_UNATTRIBUTED)
        self.tenant_cost.labels(tenant, model).inc(max(0.0, record.cost_dollars))
        self.tenant_requests.labels(tenant, model).inc(1)
        for cause, tokens in record.miss_tokens.items():
            if cause in MISS_CAUSE_VALUES:  # a bounded label: forwarded records may say more
                self.miss_tokens.labels(model, cause).inc(max(0, tokens))
                self.miss_dollars.labels(model, cause).inc(
                    max(0.0, record.miss_dollars.get(cause, 0.0)))
        if record.router_predicted_cache_hit is not None:  # the router's guess vs the engine
            self.router_cache.labels(model, M.ROUTER_KIND_INPUT).inc(record.input_tokens)
            self.router_cache.labels(model, M.ROUTER_KIND_PREDICTED).inc(
                record.router_predicted_cache_hit * record.input_tokens)
            self.router_cache.labels(model, M.ROUTER_KIND_ACTUAL).inc(record.cache_read_tokens)
        if record.slo is not None and record.slo_outcome is not None:
            slo = self._slo(record.slo)
            outcome = (record.slo_outcome if record.slo_outcome in SLO_OUTCOMES
                       else OUTCOME_UNKNOWN)
            if (slo, model) not in self._slo_models:
                # every outcome's series from the class's first record: a class with no
                # miss yet has a miss rate of 0, not no data (its error ratio exists)
                self._slo_models.add((slo, model))
                for each in OUTCOMES:
                    self.slo_requests.labels(slo, each, model)
                    self.slo_dollars.labels(slo, each, model)
            self.slo_requests.labels(slo, outcome, model).inc(1)
            self.slo_dollars.labels(slo, outcome, model).inc(max(0.0, record.cost_dollars))
        bucket = context_bucket_index(context_tokens(record))
        self.context_cost.labels(model, self._context_buckets[bucket]).inc(
            max(0.0, record.cost_dollars))
        if record.response_chunks:
            small = min(record.small_chunks, record.response_chunks)
            self.response_chunks.labels(model, M.CHUNK_SIZE_SMALL).inc(small)
            self.response_chunks.labels(model, M.CHUNK_SIZE_NORMAL).inc(
                record.response_chunks - small)

    def consume_idle_cost(self, idle: IdleCost) -> None:
        """Idle dollars; a negative row (idle a late record was charged from, afterwards)
        counts on the reclaimed counter, so both stay monotonic."""
        pool = self._pool(idle.pool)
        if idle.dollars >= 0:
            self.idle_cost.labels(pool).inc(idle.dollars)
        else:
            self.idle_reclaimed.labels(pool).inc(-idle.dollars)
        if idle.energy_joules > 0:
            self.idle_energy.labels(pool).inc(idle.energy_joules)

    def render(self) -> str:
        """The /metrics body: request metrics, then the registry (self-telemetry)."""
        return render(self._families) + generate_latest(self.registry).decode("utf-8")

    def shutdown(self) -> None:
        """Nothing buffered: metrics are updated as records arrive."""


class _StageSeries:
    """The series of one stage and model: its duration histogram, and its cost and energy
    counters by phase label, each looked up on first use (a series appears when first
    written)."""

    __slots__ = ("_cost", "_cost_by_phase", "_energy", "_energy_by_phase", "_model",
                 "_stage", "duration")

    def __init__(self, duration: FastHistogram, cost: FastCounter, energy: FastCounter,
                 stage: str, model: str) -> None:
        self.duration = duration.labels(stage, model)
        self._cost = cost
        self._energy = energy
        self._stage = stage
        self._model = model
        self._cost_by_phase: dict[str, CounterChild] = {}
        self._energy_by_phase: dict[str, CounterChild] = {}

    def cost(self, phase: str) -> CounterChild:
        child = self._cost_by_phase.get(phase)
        return child if child is not None else self._first(self._cost, self._cost_by_phase,
                                                           phase)

    def energy(self, phase: str) -> CounterChild:
        child = self._energy_by_phase.get(phase)
        return child if child is not None else self._first(self._energy,
                                                           self._energy_by_phase, phase)

    def _first(self, family: FastCounter, by_phase: dict[str, CounterChild],
               phase: str) -> CounterChild:
        child = by_phase[phase] = family.labels(self._stage, phase, self._model)
        return child


class SloConfigCollector(Collector):
    """The configured SLO classes: each one's objective, and their digest."""

    def __init__(self, slo: SloConfig) -> None:
        self._slo = slo

    def collect(self) -> Iterator[Metric]:
        objective = GaugeMetricFamily(M.SLO_OBJECTIVE.name, M.SLO_OBJECTIVE.help,
                                      labels=list(M.SLO_OBJECTIVE.labels))
        for name in self._slo.names():
            cls = self._slo.by_name(name)
            if cls is not None and cls.has_targets:
                objective.add_metric([name], cls.objective)
        yield objective
        info = GaugeMetricFamily(M.SLO_CONFIG_INFO.name, M.SLO_CONFIG_INFO.help,
                                 labels=list(M.SLO_CONFIG_INFO.labels))
        info.add_metric([self._slo.digest()], 1.0)
        yield info


class _LabelTelemetry(Telemetry):
    """How often each bounded label of the request metrics overflowed to ``other``."""

    def __init__(self, labels: Sequence[BoundedLabel]) -> None:
        self.label_overflow = CountsRead(M.LABEL_OVERFLOW,
                                         lambda: {b.name: b.overflowed for b in labels})


class TelemetryExporter(Collector):
    """Writes every instrument of every component's telemetry holder
    (:mod:`tokenpath.telemetry`) at scrape time; a renamed metric also under its old name
    (``metric_names.RENAMED_FROM``)."""

    def __init__(self, holders: Sequence[Telemetry]) -> None:
        self._holders = list(holders)

    def add(self, holder: Telemetry) -> None:
        self._holders.append(holder)

    def collect(self) -> Iterator[Metric]:
        for holder in self._holders:
            for instrument in holder.instruments():
                yield from _families(instrument)


def _families(instrument: Instrument) -> Iterator[Metric]:
    spec = instrument.spec
    names = [spec.name]
    old = M.RENAMED_FROM.get(spec.name.removeprefix(M.NAMESPACE + "_"))
    if old is not None:
        names.append(f"{M.NAMESPACE}_{old}")
    for name in names:
        if isinstance(instrument, Level):
            yield GaugeMetricFamily(name, spec.help, value=instrument.value)
        elif isinstance(instrument, Count):
            yield CounterMetricFamily(name, spec.help, value=instrument.value)
        else:
            family = CounterMetricFamily(name, spec.help, labels=list(spec.labels))
            for key, n in instrument.snapshot():
                family.add_metric(list(key) if isinstance(key, tuple) else [str(key)], n)
            yield family
