"""``CostAttributor``: dollars onto every record, idle cost per pool (docs/cost-model.md).

Sits between the stage mapper and the sinks (``collector/interfaces.py``), called from one
thread only (the pipeline's worker, :mod:`tokenpath.collector.pipeline_worker`), so it
holds no lock. A record arrives only after its request ended, so a node's slice can be
apportioned once every request active in it has arrived. Each pricing unit (a node, else
an engine: :mod:`tokenpath.identity`) keeps its own timeline (:mod:`.apportion`), closed
up to its own event-time watermark: the newest engine time its records have shown
(their latest engine end) less its allowed lateness, the longest recent event-time lag
(that newest engine time minus an arriving record's engine start) plus a margin, bounded
by ``min_delay_seconds`` and ``max_delay_seconds``. Only the unit's own records move it,
so a backlog replayed at full speed is apportioned against the engine timeline it belongs
to, as it was live, and a busy node never holds back another's records. The wall clock
only bounds how long a quiet unit holds its open slices: once a unit has received nothing
for ``min_delay_seconds``, its watermark runs on with the wall clock (its last records
come out and its idle time is closed; ``tick``). Finished records get their stage dollars
and go downstream, and unused GPU time goes downstream as
:class:`tokenpath.records.IdleCost`. ``shutdown()`` closes every node and flushes.

A unit priced from records that other replicas forwarded is closed instead at the minimum
of its sources' reported progress (:mod:`.sources`, ``consume_forwarded`` and
``consume_progress``), so no live replica's record misses the window however far it runs
behind the others.

A record that still arrives after its unit's watermark passed its engine start (it lagged
its unit's newest engine time by more than the allowed lateness, or its unit had gone
quiet) is charged from the idle of the closed slices it overlaps (``late_records``,
``late_dollars``; the idle it takes goes downstream as negative :class:`IdleCost` rows),
and what that idle cannot cover is counted as unpriced (``late_unpriced_dollars``), never
charged on top: the others in those slices have already paid.

Conservation: per node, the attributed GPU dollars of the records plus the idle dollars
(negative rows included) equal gpu_count x $/GPU-second x the window (see ``ledger``),
late records included.

Bounded steps. Closing a unit's slices and pricing the records they finish is queued
work, done by :meth:`CostAttributor.step`: each step closes at most
``max_slices_per_step`` slices (slices closed plus engine events taken) and prices at
most ``max_records_per_step`` records, the rest left queued for the next step.
Called directly, ``consume_record``, ``tick`` and ``shutdown`` run the steps until
nothing is queued. Once the pipeline worker has given its hook
(:meth:`CostAttributor.yield_between_steps`), ``consume_record`` and ``tick`` only queue:
the worker runs the steps after each item, giving up the GIL between two, so the
receivers, ``/metrics`` and the API answer while a large close runs (compiled code never
releases the GIL by itself), and the closes a batch of records asks for run together.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tokenpath import metric_names as M
from tokenpath.collector.cost.apportion import (
    DEFAULT_ENGINE_RETIRE_SECONDS,
    MIN_IN_MODEL_FRACTION,
    EngineInterval,
    LateCharge,
    NodeTimeline,
    is_finite_interval,
    price_late_interval,
)
from tokenpath.collector.cost.cache import (
    DEFAULT_BLOCK_TOKENS,
    DEFAULT_RECENT_CAPACITY,
    DEFAULT_RECENT_TTL_SECONDS,
    PrefixCacheTracker,
)
from tokenpath.collector.cost.catalog import roofline_for_record
from tokenpath.collector.cost.energy import (
    ENERGY_MEASURED,
    ENERGY_MODELED,
    GpuEnergyReadings,
    modeled_joules_per_dollar,
)
from tokenpath.collector.cost.prices import PriceSheet
from tokenpath.collector.cost.sources import SourceProgress, UnitSources
from tokenpath.collector.cost.stage_cost import (
    has_kv_transfer,
    land_cpu_and_network_cost,
    land_gpu_cost,
)
from tokenpath.collector.cost.watermark import EventClock, LatenessBounds
from tokenpath.collector.interfaces import RecordSink
from tokenpath.config import ConfigError, check, validate_fields
from tokenpath.identity import pricing_unit
from tokenpath.records import IdleCost, RequestRecord
from tokenpath.roofline import Roofline
from tokenpath.stage_members import DECODE, GPU_DISPATCH, MODELED, PREFILL
from tokenpath.telemetry import Count, Level, Telemetry

log = logging.getLogger(__name__)

# bounds of a unit's allowed lateness (event-time seconds); the minimum is also how long
# a unit receives nothing before the wall clock moves its watermark on
DEFAULT_MIN_DELAY_SECONDS = 5.0
DEFAULT_MAX_DELAY_SECONDS = 300.0
DEFAULT_LAG_WINDOW = 2048  # recent records whose event-time lag sets the allowed lateness
DEFAULT_LAG_MARGIN_SECONDS = 2.0
DEFAULT_LATE_HORIZON_SECONDS = 120.0  # closed slices kept this long to price late records
MAX_CLOSED_SLICES_PER_NODE = 50_000  # bounds memory: a few hundred bytes each
DEFAULT_TICK_SECONDS = 1.0
# A record closes its unit's slices up to the watermark only once the watermark has moved
# this far since that unit's last such close (the tick closes regardless): a close has a
# fixed cost (the timeline's advance, the ledger, the idle rows) whether it finishes one
# record or a hundred, and closing on every record paid it per record (about a tenth of
# pricing, docs/performance.md). Records wait for the watermark (the allowed lateness)
# anyway; slices are cut at engine events, so no dollar depends on when closes happen.
DEFAULT_CLOSE_STEP_SECONDS = 0.1
# a node whose agent reports GPU energy is closed no further than its readings reach, for
# at most this long behind the watermark (then its slices are priced with modeled joules)
DEFAULT_ENERGY_MAX_WAIT_SECONDS = 30.0
DEFAULT_MAX_PENDING_RECORDS = 100_000
# Sharded pricing (.sources): a unit's window waits this long after its first forwarded
# message before it trusts the set of replicas it has heard from, and a replica that sent
# no progress for this long leaves the minimum (a dead replica holds its units no longer).
# The timeout is well under the forwarder's max_retry_seconds (300 s): a replica retrying
# longer than it is expired, and its records that then arrive are priced late.
DEFAULT_SOURCE_DISCOVERY_SECONDS = 10.0
DEFAULT_SOURCE_TIMEOUT_SECONDS = 60.0
# A pricing step's work (cost.max_slices_per_step, cost.max_records_per_step): a slice or
# an engine event costs a few microseconds compiled, a record's pricing and sinks tens;
# a step stays within milliseconds (docs/cost-model.md, "Bounded steps").
DEFAULT_MAX_SLICES_PER_STEP = 1_000
DEFAULT_MAX_RECORDS_PER_STEP = 200
MAX_REMEMBERED_RECORD_IDS = 200_000  # to drop a record priced already (re-sent batches)
# an expired or stopped source is forgotten after this many source timeouts
SOURCE_MEMORY_TIMEOUTS = 10.0


@dataclass(slots=True)
class AttributorConfig:
    min_delay_seconds: float = field(default=DEFAULT_MIN_DELAY_SECONDS, metadata=check(ge=0))
    max_delay_seconds: float = DEFAULT_MAX_DELAY_SECONDS  # >= min_delay_seconds
    lag_window: int = field(default=DEFAULT_LAG_WINDOW, metadata=check(ge=1))
    lag_margin_seconds: float = field(default=DEFAULT_LAG_MARGIN_SECONDS, metadata=check(ge=0))
    max_pending_records: int = field(default=DEFAULT_MAX_PENDING_RECORDS, metadata=check(ge=1))
    prefix_block_tokens: int = field(default=DEFAULT_BLOCK_TOKENS, metadata=check(ge=1))
    recent_prefix_ttl_seconds: float = field(default=DEFAULT_RECENT_TTL_SECONDS,
                                             metadata=check(gt=0))
    recent_prefix_capacity: int = field(default=DEFAULT_RECENT_CAPACITY, metadata=check(ge=1))
    late_horizon_seconds: float = field(default=DEFAULT_LATE_HORIZON_SECONDS,
                                        metadata=check(ge=0))
    # 0: the worker never ticks (call tick())
    tick_seconds: float = field(default=DEFAULT_TICK_SECONDS, metadata=check(ge=0))
    # 0: close on every record
    close_step_seconds: float = field(default=DEFAULT_CLOSE_STEP_SECONDS, metadata=check(ge=0))
    # without an inventory entry, an engine's GPUs count (for idle) until it has served
    # nothing this long: a restarted pod or a gone process stops costing idle
    engine_retire_seconds: float = field(default=DEFAULT_ENGINE_RETIRE_SECONDS,
                                         metadata=check(gt=0))
    energy_max_wait_seconds: float = field(default=DEFAULT_ENERGY_MAX_WAIT_SECONDS,
                                           metadata=check(ge=0))
    source_discovery_seconds: float = field(default=DEFAULT_SOURCE_DISCOVERY_SECONDS,
                                            metadata=check(ge=0))
    source_timeout_seconds: float = field(default=DEFAULT_SOURCE_TIMEOUT_SECONDS,
                                          metadata=check(gt=0))

    @property
    def lateness_bounds(self) -> LatenessBounds:
        return LatenessBounds(self.min_delay_seconds, self.max_delay_seconds,
                              self.lag_window, self.lag_margin_seconds)
    # bounded steps: slices closed (and engine events taken), records priced, per step
    max_slices_per_step: int = field(default=DEFAULT_MAX_SLICES_PER_STEP, metadata=check(ge=1))
    max_records_per_step: int = field(default=DEFAULT_MAX_RECORDS_PER_STEP,
                                      metadata=check(ge=1))

    def validate(self) -> None:
        validate_fields(self, "cost")
        if not self.max_delay_seconds >= self.min_delay_seconds:
            raise ConfigError("cost.max_delay_seconds", "must be >= cost.min_delay_seconds")


@dataclass(slots=True)
class NodeLedger:
    """One pricing unit's window and where its GPU dollars went."""

    pool: str
    gpu_type: str
    gpu_count: int
    window_start: float | None = None
    closed_until: float | None = None
    node_dollars: float = 0.0
    attributed_dollars: float = 0.0
    idle_dollars: float = 0.0
    # GPU energy: the records' and the idle GPU time's joules; the meter's joules over
    # the slices it covered (busy + idle there equal them) and the seconds with and
    # without a reading
    attributed_joules: float = 0.0
    idle_joules: float = 0.0
    measured_joules: float = 0.0
    measured_seconds: float = 0.0
    modeled_seconds: float = 0.0
    # seconds the engine reports in-model vs the wall time they took (all its records)
    in_model_seconds: float = 0.0
    elapsed_seconds: float = 0.0
    # late records: charged from the idle of closed slices (moved from idle_dollars to
    # attributed_dollars), and what that idle could not cover (in neither)
    late_dollars: float = 0.0
    late_unpriced_dollars: float = 0.0
    # False: not in the price sheet's inventory, priced as its engines' GPUs of its type
    in_inventory: bool = False

    @property
    def in_model_fraction(self) -> float:
        """Share of the engine's wall time it reports as in-model, over all its records:
        below 1 when its step loop leaves the GPU idle between steps (a simulated engine
        summing step times); vLLM reports the whole wall time, so 1. Slices are priced
        with the ratio of the records active in them (deterministic whatever the order
        records arrive in); this is the unit's overall figure."""
        if self.elapsed_seconds <= 0:
            return 1.0
        fraction = self.in_model_seconds / self.elapsed_seconds
        return min(1.0, max(MIN_IN_MODEL_FRACTION, fraction))


class AttributorStats(Telemetry):
    """The cost attributor's telemetry (written by the pipeline worker alone)."""

    def __init__(self, pending: Callable[[], float], pending_closes: Callable[[], float],
                 step_slices: int, step_records: int) -> None:
        self.records_in = Count(M.PRICING_RECORDS_IN)
        self.records_out = Count(M.PRICING_RECORDS_OUT)
        self.without_timeline = Count(M.RECORDS_WITHOUT_TIMELINE)
        self.late_records = Count(M.RECORDS_LATE)
        # charged to late records from the idle of the closed slices they overlap, and
        # what that idle could not cover (not charged)
        self.late_dollars = Count(M.RECORDS_LATE_DOLLARS)
        self.late_unpriced_dollars = Count(M.RECORDS_LATE_UNPRICED_DOLLARS)
        self.forced_closes = Count(M.PRICING_FORCED_CLOSES)
        # a record id seen again (a re-sent forwarded batch): dropped
        self.duplicates = Count(M.RECORDS_DUPLICATE)
        # closed past a node's energy readings (those joules modeled)
        self.energy_waits_expired = Count(M.ENERGY_WAITS_EXPIRED)
        self.pending_records = Level(M.RECORDS_PENDING_PRICE, pending)
        # a forwarding replica that sent no progress for cost.source_timeout_seconds
        self.sources_expired = Count(M.PRICING_SOURCES_EXPIRED)
        self.progress_in = Count(M.PRICING_PROGRESS_IN)
        # bounded steps: how many ran, their configured size, and the closes queued
        self.steps = Count(M.PRICING_STEPS)
        self.step_slices = Level(M.PRICING_STEP_SLICES)
        self.step_slices.set(step_slices)
        self.step_records = Level(M.PRICING_STEP_RECORDS)
        self.step_records.set(step_records)
        self.pending_closes = Level(M.PRICING_PENDING_CLOSES, pending_closes)


@dataclass(slots=True, init=False)  # a written __init__: see tokenpath/records.py
class _Pending:
    record: RequestRecord
    interval: EngineInterval
    roofline: Roofline | None

    def __init__(self, record: RequestRecord, interval: EngineInterval,
                 roofline: Roofline | None) -> None:
        self.record = record
        self.interval = interval
        self.roofline = roofline


@dataclass(slots=True)
class _Node:
    name: str
    ledger: NodeLedger
    timeline: NodeTimeline
    # its records' event time and allowed lateness: its watermark as a lone collector
    clock: EventClock
    pending: dict[int, _Pending] = field(default_factory=dict)
    # a record's close waits until the watermark reaches this (cost.close_step_seconds)
    next_close: float = -math.inf
    # a queued close (CostAttributor.step): up to ``target``, or everything (``flush``)
    target: float = -math.inf
    flush: bool = False


class CostAttributor:
    """Mapper -> CostAttributor -> sinks. Single-threaded: the pipeline worker calls it."""

    def __init__(
        self,
        downstream: RecordSink,
        prices: PriceSheet,
        clock: Callable[[], float] = time.time,
        config: AttributorConfig | None = None,
        energy: GpuEnergyReadings | None = None,
    ) -> None:
        self._config = config or AttributorConfig()
        self._config.validate()
        prices.validate()
        self._downstream = downstream
        self._prices = prices
        self._clock = clock
        self._energy = energy
        self._nodes: dict[str, _Node] = {}
        # units priced here from forwarding replicas: their sources' progress
        self._sources: dict[str, UnitSources] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()  # recent record ids
        self._next_key = 0
        self._pending_total = 0
        self._closed = False
        # bounded steps: the units with a close queued (in the order asked), the records
        # their closes finished that wait to be priced, and the hook run between steps
        self._due: dict[str, _Node] = {}
        self._ready: deque[tuple[_Pending, _Node]] = deque()
        self._between_steps: Callable[[], None] | None = None
        self._deferred = False  # the pipeline worker runs the steps
        # called after each step with the slices it closed and the records it priced
        self.step_observer: Callable[[int, int], None] | None = None
        # closed slices are kept as long as a record may still be waited for, so a late
        # record (a request longer than the delay) is priced over all of them
        self._late_horizon = max(self._config.late_horizon_seconds,
                                 self._config.max_delay_seconds + self._config.lag_margin_seconds)
        self.stats = AttributorStats(lambda: self._pending_total, lambda: len(self._due),
                                     self._config.max_slices_per_step,
                                     self._config.max_records_per_step)
        self.cache = PrefixCacheTracker(
            block_tokens=self._config.prefix_block_tokens,
            ttl_seconds=self._config.recent_prefix_ttl_seconds,
            capacity=self._config.recent_prefix_capacity,
        )

    @property
    def tick_seconds(self) -> float:
        """How often the pipeline worker should call :meth:`tick` (0: never)."""
        return self._config.tick_seconds

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Nothing runs here: the pipeline worker calls :meth:`tick`."""

    def shutdown(self) -> None:
        """Close every node's window, flush all records and idle cost, shut downstream."""
        if self._closed:
            return
        self._closed = True
        for node in self._nodes.values():
            node.flush = True
            self._due[node.name] = node
        self._run_steps()
        self._downstream.shutdown()

    def yield_between_steps(self, hook: Callable[[], None] | None) -> None:
        """From now on ``consume_record`` and ``tick`` leave the queued work to
        :meth:`step`, which the caller (the pipeline worker) runs, calling ``hook``
        between two steps (``shutdown`` too); None: they run the steps themselves."""
        self._between_steps = hook
        self._deferred = hook is not None

    # -- data path ------------------------------------------------------------------------

    def consume_record(self, record: RequestRecord) -> None:
        """A record mapped by this collector."""
        self._consume(record, None)

    def consume_forwarded(self, record: RequestRecord, source: str | None) -> None:
        """A record another replica mapped and forwarded here; ``source``: that replica's
        identity (None from a replica that reports no progress)."""
        self._consume(record, source)

    def consume_progress(self, mark: SourceProgress) -> None:
        """A forwarding replica's progress for one unit (:mod:`.sources`): the unit's
        window may now move."""
        self.stats.progress_in.inc()
        if self._closed:
            return
        now = self._clock()
        self._sources_of(mark.unit, now).progress(mark, now)
        node = self._nodes.get(mark.unit)
        if node is None:
            return
        self._request_close(node, self._energy_stop(node, self._watermark(node, now)))
        if not self._deferred:
            self._run_steps()

    def _sources_of(self, unit: str, now: float) -> UnitSources:
        sources = self._sources.get(unit)
        if sources is None:
            sources = UnitSources(now)
            self._sources[unit] = sources
        return sources

    def _consume(self, record: RequestRecord, source: str | None) -> None:
        out_records: list[RequestRecord] = []
        out_idle: list[IdleCost] = []
        self.stats.records_in.inc()
        if record.record_id in self._seen:  # a forwarded batch sent again: priced once
            self.stats.duplicates.inc()
            return
        self._seen[record.record_id] = None
        if len(self._seen) > MAX_REMEMBERED_RECORD_IDS:
            self._seen.popitem(last=False)
        if source is not None:
            self._sources_of(pricing_unit(record.node, record.engine_id),
                             self._clock()).record(source, self._clock())
        self._price_record_basics(record)
        node = None if self._closed else self._admit(record, out_records, out_idle)
        if node is None:
            if not out_records:  # not held: nothing to apportion
                record.cost_dollars = sum(t.cost_dollars for t in record.stages.values())
                out_records.append(record)
        else:
            # the unit has just received a record: its event-time watermark (a unit with
            # forwarding sources: the minimum of their progress)
            stop = (node.clock.stop() if node.name not in self._sources
                    else self._watermark(node, self._clock()))
            if stop >= node.next_close:
                node.next_close = stop + self._config.close_step_seconds
                self._request_close(node, self._energy_stop(node, stop))
        self._emit(out_records, out_idle)
        if not self._deferred:
            self._run_steps()

    def consume_idle_cost(self, idle: IdleCost) -> None:
        """Idle cost computed upstream (none today) passes through."""
        self._downstream.consume_idle_cost(idle)

    def tick(self) -> None:
        """Close whatever each unit's watermark allows; the pipeline worker calls it while
        traffic is sparse (a quiet unit's watermark moves with the wall clock only here)."""
        if self._closed:
            return
        now = self._clock()
        # what the last tick's closes left: a unit every engine of which is gone costs no
        # idle and no memory
        for name in [n for n, node in self._nodes.items()
                     if not node.pending and n not in self._due and node.timeline.retired]:
            del self._nodes[name]
            self._sources.pop(name, None)
        horizon = SOURCE_MEMORY_TIMEOUTS * self._config.source_timeout_seconds
        for sources in self._sources.values():
            sources.forget_gone(now, horizon)
        for node in self._nodes.values():
            self._request_close(node, self._energy_stop(node, self._watermark(node, now)))
        if not self._deferred:
            self._run_steps()

    def lateness_for(self, unit: str) -> float:
        """How far (engine seconds) behind its newest engine time ``unit``'s records may
        start and still be apportioned with the others (its allowed lateness now)."""
        node = self._nodes.get(unit)
        return self._lateness(node) if node is not None else self._config.min_delay_seconds

    @property
    def lateness_seconds(self) -> float:
        """The longest allowed lateness of any unit now."""
        return max((self._lateness(n) for n in self._nodes.values()),
                   default=self._config.min_delay_seconds)

    def watermark_for(self, unit: str) -> float | None:
        """Where ``unit``'s slices may be closed now (engine time); None: unknown unit."""
        node = self._nodes.get(unit)
        return None if node is None else self._watermark(node, self._clock())

    def _lateness(self, node: _Node) -> float:
        return node.clock.lateness()

    def _watermark(self, node: _Node, now: float) -> float:
        """Where ``node``'s slices may be closed now: with forwarding sources, the minimum
        of their progress (:mod:`.sources`); else (or with none of them live) its own
        records' watermark (:mod:`.watermark`)."""
        sources = self._sources.get(node.name)
        if sources is not None:
            cfg = self._config
            stop = sources.watermark(now, cfg.source_discovery_seconds,
                                     cfg.source_timeout_seconds, self._source_expired)
            if stop is not None:
                return stop
        return node.clock.watermark(now)

    def _source_expired(self, source: str) -> None:
        self.stats.sources_expired.inc()
        log.warning("cost: forwarding replica %s sent no progress for %.0f s "
                    "(cost.source_timeout_seconds); its units' windows move on without it",
                    source, self._config.source_timeout_seconds)

    @property
    def pending_records(self) -> int:
        return self._pending_total

    @property
    def ledger(self) -> dict[str, NodeLedger]:
        return {name: node.ledger for name, node in self._nodes.items()}

    # -- internals ------------------------------------------------------------------------

    def _emit(self, records: list[RequestRecord], idle: list[IdleCost]) -> None:
        for record in records:
            self.stats.records_out.inc()
            self._downstream.consume_record(record)
        for item in idle:
            self._downstream.consume_idle_cost(item)

    def _node_for(self, record: RequestRecord) -> _Node:
        name = pricing_unit(record.node, record.engine_id)
        node = self._nodes.get(name)
        if node is None:
            in_inventory = record.node is not None and record.node in self._prices.nodes
            spec = self._prices.node_spec(record.node)
            gpu_type = spec.gpu_type or record.gpu_type or self._prices.default_gpu_type
            if gpu_type not in self._prices.gpus:
                gpu_type = self._prices.default_gpu_type
            price = self._prices.gpu_price(gpu_type).dollars_per_second
            timeline = NodeTimeline(
                price, spec.gpu_count, MAX_CLOSED_SLICES_PER_NODE, self._late_horizon,
                self._config.engine_retire_seconds,
                modeled_joules_per_dollar=modeled_joules_per_dollar(price, gpu_type),
                meter=None if self._energy is None else self._energy.meter(name))
            ledger = NodeLedger(pool=record.pool or spec.pool, gpu_type=gpu_type,
                                gpu_count=timeline.gpu_count,
                                in_inventory=in_inventory and spec.gpu_count is not None)
            node = _Node(name, ledger, timeline, EventClock(self._config.lateness_bounds))
            self._nodes[name] = node
        return node

    def _price_record_basics(self, record: RequestRecord) -> None:
        spec = self._prices.node_spec(record.node)
        kv_bytes_per_token = None
        if has_kv_transfer(record):  # P/D: the prompt's KV crossed the network (modeled)
            roofline = roofline_for_record(record, spec.gpu_type or record.gpu_type or "")
            kv_bytes_per_token = None if roofline is None else roofline.model.kv_bytes_per_token
        land_cpu_and_network_cost(record, self._prices.cpu_dollars_per_core_second,
                                  self._prices.network_dollars_per_byte, kv_bytes_per_token)
        price = self._prices.gpu_price(spec.gpu_type or record.gpu_type)
        gpus = max(1, record.tensor_parallel)
        record.naive_cost_dollars = record.duration_seconds * price.dollars_per_second * gpus

    def _admit(self, record: RequestRecord, out_records: list[RequestRecord],
               out_idle: list[IdleCost]) -> _Node | None:
        ps, ds, end = record.prefill_start_unix, record.decode_start_unix, record.engine_end_unix
        if ps is None or ds is None or end is None or not is_finite_interval(ps, ds, end):
            self.stats.without_timeline.inc()
            return None
        node = self._node_for(record)
        ledger = node.ledger
        record.gpu_inventory = ledger.in_inventory
        roofline = roofline_for_record(record, ledger.gpu_type)
        # event time: its engine end, but never ahead of this collector's clock (a bogus
        # timestamp cannot close the unit's window far ahead of its records)
        node.clock.observe(ps, end, self._clock())
        gpus = max(1, record.tensor_parallel)
        interval = EngineInterval(
            key=self._next_key,
            group=(record.engine_id or "", record.model, ledger.gpu_type, gpus),
            roofline=roofline,
            prefill_start=ps,
            decode_start=ds,
            end=end,
            input_tokens=max(0, record.input_tokens),
            cached_tokens=max(0, record.cache_read_tokens),
            output_tokens=max(0, record.output_tokens),
            gpus=gpus,
            prefill_steps=_prefill_steps(record),
            in_model_ratio=self._observe_in_model(ledger, record),
        )
        self._next_key += 1
        closed = node.timeline.closed_until
        if closed is not None and ps < closed:
            self._price_late(node, interval, closed, record.trace_id, out_idle)
        item = _Pending(record, interval, roofline)
        if not node.timeline.add(interval):  # all of it was in closed slices
            self._finish(item, node)
            out_records.append(item.record)
            return None
        ledger.gpu_count = node.timeline.gpu_count
        node.pending[interval.key] = item
        self._pending_total += 1
        return node

    @staticmethod
    def _observe_in_model(ledger: NodeLedger, record: RequestRecord) -> float | None:
        """GPU step seconds vs the engine's in-model wall time: the engine's own step sum
        (tokenpath.engine.step_seconds) when it reports one, else in-model seconds vs
        scheduled (engine span start + queue) to end. None when the record cannot say."""
        end = record.engine_end_unix
        prefill, decode = record.prefill_seconds, record.decode_seconds
        if end is None or prefill is None or decode is None:
            return None
        if record.engine_step_seconds is not None:
            in_model, elapsed = record.engine_step_seconds, prefill + decode
        elif record.engine_start_unix is not None:
            in_model = prefill + decode
            elapsed = end - (record.engine_start_unix + (record.queue_seconds or 0.0))
        else:
            return None
        if elapsed <= 0 or in_model <= 0 or in_model > elapsed * (1 + 1e-6):
            return None
        ledger.in_model_seconds += in_model
        ledger.elapsed_seconds += elapsed
        return min(1.0, in_model / elapsed)

    def _price_late(self, node: _Node, interval: EngineInterval, closed: float,
                    trace_id: str, out_idle: list[IdleCost]) -> None:
        """Its slices before ``closed`` were apportioned without it: charge it from their
        idle (``late_dollars``; the idle taken goes out as negative idle rows) and count
        what that idle cannot cover (``late_unpriced_dollars``); apportion only the rest
        normally."""
        self.stats.late_records.inc()
        if self.stats.late_records.value == 1:
            log.warning("cost: record %s arrived after its unit's watermark passed its engine "
                        "start; charged from the idle of the closed slices (cost."
                        "max_delay_seconds bounds the allowed lateness); further ones are only "
                        "counted", trace_id)
        charge: LateCharge = price_late_interval(
            interval, node.timeline.closed_after(interval.prefill_start), closed,
            node.timeline.dollars_per_gpu_second)
        interval.late_dollars = charge.charged
        interval.late_unpriced_dollars = charge.unpriced
        self.stats.late_dollars.inc(charge.charged)
        self.stats.late_unpriced_dollars.inc(charge.unpriced)
        ledger = node.ledger
        ledger.late_dollars += charge.charged
        ledger.late_unpriced_dollars += charge.unpriced
        ledger.attributed_dollars += charge.charged
        ledger.idle_dollars -= charge.charged
        rows = merge_idle_spans(ledger.pool, charge.idle_spans)
        for row in rows:
            ledger.idle_joules += row.energy_joules
        out_idle.extend(rows)

    def _force_if_over_capacity(self) -> None:
        """Over ``max_pending_records`` held, close the oldest ends early (counted)."""
        excess = self._pending_total - len(self._ready) - self._config.max_pending_records
        if excess <= 0:
            return
        self.stats.forced_closes.inc()
        ends = heapq.nsmallest(excess, (p.interval.end for node in self._nodes.values()
                                        for p in node.pending.values()))
        stop = ends[-1]
        now = self._clock()
        for node in self._nodes.values():
            self._request_close(node, max(stop, self._watermark(node, now)))

    def _energy_stop(self, node: _Node, stop: float) -> float:
        """``stop``, held back to where the node's energy readings reach (for at most
        ``energy_max_wait_seconds``)."""
        if self._energy is None:
            return stop
        known = self._energy.known_until(node.name)
        if known is None or known >= stop:
            return stop
        if known >= stop - self._config.energy_max_wait_seconds:
            return known
        self.stats.energy_waits_expired.inc()
        if self.stats.energy_waits_expired.value == 1:
            log.warning("cost: node %s's GPU energy readings stopped at %.1f; its slices "
                        "past them are priced with modeled joules (cost."
                        "energy_max_wait_seconds); further ones are only counted",
                        node.name, known)
        return stop

    def _request_close(self, node: _Node, stop: float) -> None:
        """Queue a close of ``node``'s slices up to ``stop`` (done by :meth:`step`)."""
        closed = node.timeline.closed_until
        if closed is not None and stop < closed:
            return
        if stop > node.target:
            node.target = stop
        self._due[node.name] = node

    def _run_steps(self) -> None:
        """Step until nothing is queued, running the between-steps hook in between."""
        while self.step():
            if self._between_steps is not None:
                self._between_steps()

    def step(self) -> bool:
        """One bounded step of the queued work: price the records earlier closes finished,
        then close queued units' slices, then price what those finished, within
        ``max_slices_per_step`` slices closed (plus engine events taken) and
        ``max_records_per_step`` records priced; the rest stays queued. True while
        work remains."""
        self._force_if_over_capacity()
        if not self._due and not self._ready:
            return False
        cfg = self._config
        out_records: list[RequestRecord] = []
        out_idle: list[IdleCost] = []
        records = self._price_ready(cfg.max_records_per_step, out_records)
        budget = cfg.max_slices_per_step
        slices = 0
        while self._due and budget > 0 and len(self._ready) < cfg.max_records_per_step:
            # taken off the queue while it closes (a failing close is not retried
            # forever); back at its end when its close is not done
            node = self._due.pop(next(iter(self._due)))
            work, closed = self._advance(node, budget, out_idle)
            budget -= work
            slices += closed
        records += self._price_ready(cfg.max_records_per_step - records, out_records)
        self._emit(out_records, out_idle)
        self.stats.steps.inc()
        if self.step_observer is not None:
            self.step_observer(slices, records)
        return bool(self._due) or bool(self._ready)

    def _price_ready(self, limit: int, out_records: list[RequestRecord]) -> int:
        """Price up to ``limit`` of the records closes finished; how many it priced."""
        done = 0
        ready = self._ready
        while ready and done < limit:
            item, node = ready.popleft()
            self._pending_total -= 1
            self._finish(item, node)
            out_records.append(item.record)
            done += 1
        return done

    def _advance(self, node: _Node, budget: int, out_idle: list[IdleCost]) -> tuple[int, int]:
        """Close ``node``'s queued slices, within ``budget``; (work done, slices closed).
        Its finished records join the ready queue; idle rows go to ``out_idle``."""
        timeline = node.timeline
        result = (timeline.flush(budget) if node.flush
                  else timeline.advance(node.target, budget))
        if result.done:
            node.target = -math.inf
            node.flush = False
        else:
            self._due[node.name] = node
        ledger = node.ledger
        ledger.window_start = timeline.window_start
        ledger.closed_until = timeline.closed_until
        ledger.node_dollars += result.node_dollars
        ledger.attributed_dollars += result.attributed_dollars
        ledger.idle_dollars += result.idle_dollars
        ledger.attributed_joules += result.attributed_joules
        ledger.idle_joules += result.idle_joules
        ledger.measured_joules += result.measured_joules
        ledger.measured_seconds += result.measured_seconds
        ledger.modeled_seconds += result.modeled_seconds
        ledger.gpu_count = timeline.gpu_count
        out_idle.extend(merge_idle_spans(ledger.pool, result.idle_spans))
        for interval in result.finished:
            item = node.pending.pop(interval.key, None)
            if item is not None:
                self._ready.append((item, node))
        return max(1, result.work), result.slices

    def _finish(self, item: _Pending, node: _Node) -> None:
        record, iv = item.record, item.interval
        assert record.prefill_start_unix is not None and record.decode_start_unix is not None
        assert record.engine_end_unix is not None
        prefill_seconds = record.decode_start_unix - record.prefill_start_unix
        decode_seconds = record.engine_end_unix - record.decode_start_unix
        land_gpu_cost(
            record,
            item.roofline,
            {PREFILL: prefill_seconds, DECODE: decode_seconds},
            iv.cost_by_phase,
            iv.average_decode_batch,
        )
        record.cache_miss_waste_dollars = self.cache.observe(
            record, iv.cost_by_phase.get(PREFILL, 0.0), item.roofline)
        per_dollar = node.timeline.modeled_joules_per_dollar
        # the part priced from closed slices others already paid for is modeled
        joules = iv.energy_joules + iv.late_dollars * per_dollar
        measured = (iv.modeled_energy_slices < 0.5 and iv.measured_energy_slices > 0.5
                    and iv.late_dollars == 0.0 and iv.late_unpriced_dollars == 0.0)
        if measured or per_dollar > 0:
            record.energy_joules = joules
            record.energy_provenance = ENERGY_MEASURED if measured else ENERGY_MODELED
        record.cost_dollars = sum(t.cost_dollars for t in record.stages.values())


def _prefill_steps(record: RequestRecord) -> float | None:
    """Engine steps of the prefill, from the record's own measurements: its measured
    per-phase gpu_dispatch (its decode phase has one step per output token after the
    first, which gives the dispatch time of one step; the prefill's dispatch divided by it
    counts its chunks), else the engine's step count (``tokenpath.engine.steps``) less its
    decode steps. None when neither was measured. Only the record's own figures are used,
    so the count does not depend on which other records arrived first."""
    timing = record.stages.get(GPU_DISPATCH)
    if timing is None or timing.provenance is MODELED or not timing.phases:
        return None
    prefill = timing.phases.get(PREFILL)
    if prefill is None or prefill.seconds <= 0:
        return None
    decode = timing.phases.get(DECODE)
    if decode is not None and decode.seconds > 0 and record.output_tokens >= 2:
        unit = decode.seconds / (record.output_tokens - 1)
        return float(max(1, round(prefill.seconds / unit)))
    if record.engine_steps is not None:
        return float(max(1, record.engine_steps - max(0, record.output_tokens - 1)))
    return None


def merge_idle_spans(pool: str, spans: list[tuple[float, float, float, float]]) -> list[IdleCost]:
    """Contiguous idle spans of one close, one row per run of the same rate (dollars and
    joules per second). A row's idle is then spread evenly over its time, so any part of
    it prices pro rata exactly however the ticks happened to cut the timeline: merging
    spans of different rates (a partly idle slice of a busy minute, then a wholly idle
    one) would make a query over part of a row depend on when the collector ticked."""
    merged: list[IdleCost] = []
    for start, end, dollars, joules in spans:
        last = merged[-1] if merged else None
        if last is not None and last.end_unix == start and _same_rate(last, end - start,
                                                                      dollars, joules):
            merged[-1] = IdleCost(pool, last.start_unix, end, last.dollars + dollars,
                                  last.energy_joules + joules)
        else:
            merged.append(IdleCost(pool, start, end, dollars, joules))
    return merged


_RATE_REL_TOL = 1e-9


def _same_rate(row: IdleCost, seconds: float, dollars: float, joules: float) -> bool:
    row_seconds = row.end_unix - row.start_unix
    if seconds <= 0 or row_seconds <= 0:  # no time: nothing to spread
        return True
    return (math.isclose(row.dollars / row_seconds, dollars / seconds, rel_tol=_RATE_REL_TOL)
            and math.isclose(row.energy_joules / row_seconds, joules / seconds,
                             rel_tol=_RATE_REL_TOL))
