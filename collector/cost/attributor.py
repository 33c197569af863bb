"""``CostAttributor``: dollars onto every record, idle cost per pool (SPEC section 5).

Sits between the stage mapper and the sinks (``tokenpath.pipeline``). A record arrives only
after its request ended, so a node's slice can be apportioned once every request active in
it has arrived. Each node's timeline is held open until a watermark ``clock() - delay``
passes, where the delay adapts to the traffic: the longest recent arrival lag (arrival
minus engine start) plus a margin, bounded by ``min_delay_seconds`` and
``max_delay_seconds``. Then its slices are apportioned (:mod:`.apportion`), finished records
get their stage dollars and go downstream, and unused GPU time goes downstream as
:class:`tokenpath.pipeline.IdleCost`. ``shutdown()`` closes every node and flushes.

A record that still arrives after its slices closed is priced from kept summaries of those
slices (``late_records``, ``late_dollars``): the others in them have already paid.

Conservation: per node, the attributed GPU dollars of the records plus the idle dollars
equal gpu_count x $/GPU-second x the window (see ``ledger``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tokenpath.collector.cost.apportion import (
    ClosedSlice,
    EngineInterval,
    close_window,
    price_late_interval,
)
from tokenpath.collector.cost.cache import (
    DEFAULT_BLOCK_TOKENS,
    DEFAULT_HEAVY_HITTER_CAPACITY,
    DEFAULT_RECENT_CAPACITY,
    DEFAULT_RECENT_TTL_SECONDS,
    PrefixCacheTracker,
)
from tokenpath.collector.cost.catalog import roofline_for_record
from tokenpath.collector.cost.prices import DEFAULT_NODE_NAME, PriceSheet
from tokenpath.collector.cost.stage_cost import land_cpu_and_network_cost, land_gpu_cost
from tokenpath.config import ConfigError
from tokenpath.pipeline import IdleCost, RecordSink
from tokenpath.records import RequestRecord
from tokenpath.roofline import Roofline
from tokenpath.stages import Phase, Provenance, StageId

log = logging.getLogger(__name__)

DEFAULT_MIN_DELAY_SECONDS = 5.0  # above the assembler's root grace
DEFAULT_MAX_DELAY_SECONDS = 300.0
DEFAULT_LAG_WINDOW = 2048  # recent records whose arrival lag sets the delay
DEFAULT_LAG_MARGIN_SECONDS = 2.0
DEFAULT_LATE_HORIZON_SECONDS = 120.0  # closed slices kept this long to price late records
MAX_CLOSED_SLICES_PER_NODE = 50_000  # bounds memory: a few hundred bytes each
DEFAULT_TICK_SECONDS = 1.0
MIN_IN_MODEL_FRACTION = 0.5  # below this the elapsed-time estimate is not trusted
DEFAULT_MAX_PENDING_RECORDS = 100_000


@dataclass(slots=True)
class AttributorConfig:
    min_delay_seconds: float = DEFAULT_MIN_DELAY_SECONDS
    max_delay_seconds: float = DEFAULT_MAX_DELAY_SECONDS
    lag_window: int = DEFAULT_LAG_WINDOW
    lag_margin_seconds: float = DEFAULT_LAG_MARGIN_SECONDS
    max_pending_records: int = DEFAULT_MAX_PENDING_RECORDS
    prefix_block_tokens: int = DEFAULT_BLOCK_TOKENS
    recent_prefix_ttl_seconds: float = DEFAULT_RECENT_TTL_SECONDS
    recent_prefix_capacity: int = DEFAULT_RECENT_CAPACITY
    heavy_hitter_capacity: int = DEFAULT_HEAVY_HITTER_CAPACITY
    late_horizon_seconds: float = DEFAULT_LATE_HORIZON_SECONDS
    tick_seconds: float = DEFAULT_TICK_SECONDS  # 0: no background ticker (call tick())

    def validate(self) -> None:
        if not self.min_delay_seconds >= 0:
            raise ConfigError("cost.min_delay_seconds", "must be >= 0")
        if not self.max_delay_seconds >= self.min_delay_seconds:
            raise ConfigError("cost.max_delay_seconds", "must be >= cost.min_delay_seconds")
        if not self.lag_margin_seconds >= 0:
            raise ConfigError("cost.lag_margin_seconds", "must be >= 0")
        if not self.late_horizon_seconds >= 0:
            raise ConfigError("cost.late_horizon_seconds", "must be >= 0")
        if not self.tick_seconds >= 0:
            raise ConfigError("cost.tick_seconds", "must be >= 0")
        for key, value in (
            ("cost.max_pending_records", self.max_pending_records),
            ("cost.lag_window", self.lag_window),
            ("cost.prefix_block_tokens", self.prefix_block_tokens),
            ("cost.recent_prefix_capacity", self.recent_prefix_capacity),
            ("cost.heavy_hitter_capacity", self.heavy_hitter_capacity),
        ):
            if value < 1:
                raise ConfigError(key, "must be >= 1")
        if not self.recent_prefix_ttl_seconds > 0:
            raise ConfigError("cost.recent_prefix_ttl_seconds", "must be > 0")


@dataclass(slots=True)
class NodeLedger:
    """One node's window and where its GPU dollars went."""

    pool: str
    gpu_type: str
    gpu_count: int
    window_start: float | None = None
    closed_until: float | None = None
    node_dollars: float = 0.0
    attributed_dollars: float = 0.0
    idle_dollars: float = 0.0
    # seconds the engine reports in-model vs the wall time they took
    in_model_seconds: float = 0.0
    elapsed_seconds: float = 0.0
    # measured gpu_dispatch seconds per engine step (decode dispatch / decode steps)
    dispatch_seconds: float = 0.0
    dispatch_steps: int = 0

    @property
    def dispatch_per_step(self) -> float | None:
        return self.dispatch_seconds / self.dispatch_steps if self.dispatch_steps else None

    @property
    def in_model_fraction(self) -> float:
        """Share of the engine's wall time it reports as in-model: below 1 when its step
        loop leaves the GPU idle between steps (a simulated engine summing step times);
        vLLM reports the whole wall time, so 1."""
        if self.elapsed_seconds <= 0:
            return 1.0
        fraction = self.in_model_seconds / self.elapsed_seconds
        return min(1.0, max(MIN_IN_MODEL_FRACTION, fraction))


@dataclass(slots=True)
class AttributorStats:
    records_in: int = 0
    records_out: int = 0
    without_timeline: int = 0
    late_records: int = 0
    late_dollars: float = 0.0  # charged to late records for slices others already paid
    forced_closes: int = 0


@dataclass(slots=True)
class _Pending:
    record: RequestRecord
    interval: EngineInterval
    roofline: Roofline | None


@dataclass(slots=True)
class _Node:
    ledger: NodeLedger
    pending: list[_Pending] = field(default_factory=list)
    closed: deque[ClosedSlice] = field(
        default_factory=lambda: deque(maxlen=MAX_CLOSED_SLICES_PER_NODE))


class CostAttributor:
    """Mapper -> CostAttributor -> sinks. Thread-safe; downstream called outside the lock."""

    def __init__(
        self,
        downstream: RecordSink,
        prices: PriceSheet,
        clock: Callable[[], float] = time.time,
        config: AttributorConfig | None = None,
    ) -> None:
        self._config = config or AttributorConfig()
        self._config.validate()
        prices.validate()
        self._downstream = downstream
        self._prices = prices
        self._clock = clock
        self._lock = threading.Lock()
        self._nodes: dict[str, _Node] = {}
        self._next_key = 0
        # sliding-window maximum of arrival lags: (sequence number, lag), lags decreasing
        self._lags: deque[tuple[int, float]] = deque()
        self._closed = False
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self.stats = AttributorStats()
        self.cache = PrefixCacheTracker(
            block_tokens=self._config.prefix_block_tokens,
            ttl_seconds=self._config.recent_prefix_ttl_seconds,
            capacity=self._config.recent_prefix_capacity,
            heavy_hitter_capacity=self._config.heavy_hitter_capacity,
        )

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the background ticker that closes slices while traffic is sparse."""
        if self._ticker is not None or self._config.tick_seconds <= 0:
            return
        self._ticker = threading.Thread(target=self._tick_loop, name="tokenpath-cost-ticker",
                                        daemon=True)
        self._ticker.start()

    def _tick_loop(self) -> None:
        while not self._stop.wait(self._config.tick_seconds):
            try:
                self.tick()
            except Exception:  # a failing sink must not kill the ticker
                log.exception("cost: tick failed")

    def shutdown(self) -> None:
        """Close every node's window, flush all records and idle cost, shut downstream."""
        self._stop.set()
        if self._ticker is not None and self._ticker is not threading.current_thread():
            self._ticker.join(timeout=5)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            out_records: list[RequestRecord] = []
            out_idle: list[IdleCost] = []
            for node in self._nodes.values():
                ends = [p.interval.end for p in node.pending]
                stop = max([*ends, node.ledger.closed_until or 0.0])
                self._close_node(node, stop, out_records, out_idle, flush_all=True)
        self._emit(out_records, out_idle)
        self._downstream.shutdown()

    # -- data path ------------------------------------------------------------------------

    def consume_record(self, record: RequestRecord) -> None:
        out_records: list[RequestRecord] = []
        out_idle: list[IdleCost] = []
        with self._lock:
            self.stats.records_in += 1
            self._price_record_basics(record)
            pending = None if self._closed else self._admit(record)
            if pending is None:
                record.cost_dollars = sum(t.cost_dollars for t in record.stages.values())
                out_records.append(record)
            self._advance(self._watermark(), out_records, out_idle)
        self._emit(out_records, out_idle)

    def consume_idle_cost(self, idle: IdleCost) -> None:
        """Idle cost computed upstream (none today) passes through."""
        self._downstream.consume_idle_cost(idle)

    def tick(self) -> None:
        """Close whatever the watermark allows; call periodically when traffic is sparse."""
        out_records: list[RequestRecord] = []
        out_idle: list[IdleCost] = []
        with self._lock:
            if not self._closed:
                self._advance(self._watermark(), out_records, out_idle)
        self._emit(out_records, out_idle)

    @property
    def delay_seconds(self) -> float:
        """How far behind the clock slices are closed now."""
        cfg = self._config
        lag = self._lags[0][1] + cfg.lag_margin_seconds if self._lags else 0.0
        return min(cfg.max_delay_seconds, max(cfg.min_delay_seconds, lag))

    def _watermark(self) -> float:
        return self._clock() - self.delay_seconds

    def _observe_lag(self, lag: float) -> None:
        sequence = self._next_key
        while self._lags and self._lags[-1][1] <= lag:
            self._lags.pop()
        self._lags.append((sequence, lag))
        while self._lags[0][0] <= sequence - self._config.lag_window:
            self._lags.popleft()

    @property
    def ledger(self) -> dict[str, NodeLedger]:
        with self._lock:
            return {name: node.ledger for name, node in self._nodes.items()}

    # -- internals ------------------------------------------------------------------------

    def _emit(self, records: list[RequestRecord], idle: list[IdleCost]) -> None:
        for record in records:
            self.stats.records_out += 1
            self._downstream.consume_record(record)
        for item in idle:
            self._downstream.consume_idle_cost(item)

    def _node_for(self, record: RequestRecord) -> tuple[str, _Node]:
        name = record.node or DEFAULT_NODE_NAME
        node = self._nodes.get(name)
        spec = self._prices.node_spec(record.node)
        if node is None:
            gpu_type = spec.gpu_type or record.gpu_type or self._prices.default_gpu_type
            if gpu_type not in self._prices.gpus:
                gpu_type = self._prices.default_gpu_type
            count = spec.gpu_count or max(1, record.tensor_parallel)
            node = _Node(NodeLedger(pool=record.pool or spec.pool, gpu_type=gpu_type,
                                    gpu_count=count))
            self._nodes[name] = node
        elif spec.gpu_count is None:
            node.ledger.gpu_count = max(node.ledger.gpu_count, record.tensor_parallel)
        return name, node

    def _price_record_basics(self, record: RequestRecord) -> None:
        land_cpu_and_network_cost(record, self._prices.cpu_dollars_per_core_second,
                                  self._prices.network_dollars_per_byte)
        spec = self._prices.node_spec(record.node)
        price = self._prices.gpu_price(spec.gpu_type or record.gpu_type)
        gpus = max(1, record.tensor_parallel)
        record.naive_cost_dollars = record.duration_seconds * price.dollars_per_second * gpus

    def _admit(self, record: RequestRecord) -> _Pending | None:
        ps, ds, end = record.prefill_start_unix, record.decode_start_unix, record.engine_end_unix
        if ps is None or ds is None or end is None or not ps <= ds <= end:
            self.stats.without_timeline += 1
            return None
        _, node = self._node_for(record)
        roofline = roofline_for_record(record, node.ledger.gpu_type)
        self._observe_lag(self._clock() - ps)
        self._observe_in_model(node.ledger, record)
        closed = node.ledger.closed_until
        late = closed is not None and ps < closed
        interval = EngineInterval(
            key=self._next_key,
            group=(record.model, node.ledger.gpu_type, max(1, record.tensor_parallel)),
            roofline=roofline,
            prefill_start=ps,
            decode_start=ds,
            end=end,
            input_tokens=max(0, record.input_tokens),
            cached_tokens=max(0, record.cache_read_tokens),
            output_tokens=max(0, record.output_tokens),
            gpus=max(1, record.tensor_parallel),
        )
        interval.prefill_steps = self._prefill_steps(node.ledger, record)
        self._next_key += 1
        if late and closed is not None:
            self._price_late(node, interval, closed, record.trace_id)
        pending = _Pending(record, interval, roofline)
        node.pending.append(pending)
        return pending

    @staticmethod
    def _prefill_steps(ledger: NodeLedger, record: RequestRecord) -> float | None:
        """Engine steps of the prefill from the measured per-phase gpu_dispatch: the decode
        phase has one step per output token after the first, which gives the dispatch time
        of one step on this node; the prefill's dispatch divided by it counts its chunks."""
        timing = record.stages.get(StageId.GPU_DISPATCH)
        if timing is None or timing.provenance is Provenance.MODELED or not timing.phases:
            return None
        decode = timing.phases.get(Phase.DECODE)
        if decode is not None and decode.seconds > 0 and record.output_tokens >= 2:
            ledger.dispatch_seconds += decode.seconds
            ledger.dispatch_steps += record.output_tokens - 1
        prefill = timing.phases.get(Phase.PREFILL)
        unit = ledger.dispatch_per_step
        if prefill is None or prefill.seconds <= 0 or unit is None or unit <= 0:
            return None
        return float(max(1, round(prefill.seconds / unit)))

    @staticmethod
    def _observe_in_model(ledger: NodeLedger, record: RequestRecord) -> None:
        """GPU step seconds vs the engine's in-model wall time: the engine's own step sum
        (tokenpath.engine.step_seconds) when it reports one, else in-model seconds vs
        scheduled (engine span start + queue) to end."""
        end = record.engine_end_unix
        prefill, decode = record.prefill_seconds, record.decode_seconds
        if end is None or prefill is None or decode is None:
            return
        if record.engine_step_seconds is not None:
            in_model, elapsed = record.engine_step_seconds, prefill + decode
        elif record.engine_start_unix is not None:
            in_model = prefill + decode
            elapsed = end - (record.engine_start_unix + (record.queue_seconds or 0.0))
        else:
            return
        if elapsed <= 0 or in_model <= 0 or in_model > elapsed * (1 + 1e-6):
            return
        ledger.in_model_seconds += in_model
        ledger.elapsed_seconds += elapsed

    def _price_late(self, node: _Node, interval: EngineInterval, closed: float,
                    trace_id: str) -> None:
        """Its slices before ``closed`` were apportioned without it: charge it its modeled
        share of them (counted in ``late_dollars``); apportion only the rest normally."""
        self.stats.late_records += 1
        if self.stats.late_records == 1:
            log.warning("cost: record %s arrived after its node's slices closed; priced from "
                        "the closed slices (cost.max_delay_seconds bounds the wait); "
                        "further ones are only counted", trace_id)
        price = self._prices.gpu_price(node.ledger.gpu_type).dollars_per_second
        self.stats.late_dollars += price_late_interval(interval, list(node.closed), closed,
                                                       price)

    def _advance(self, watermark: float, out_records: list[RequestRecord],
                 out_idle: list[IdleCost]) -> None:
        total = sum(len(node.pending) for node in self._nodes.values())
        excess = total - self._config.max_pending_records
        if excess > 0:
            ends = sorted(p.interval.end for node in self._nodes.values() for p in node.pending)
            watermark = max(watermark, ends[excess - 1])
            self.stats.forced_closes += 1
        for node in self._nodes.values():
            self._close_node(node, watermark, out_records, out_idle, flush_all=False)

    def _close_node(self, node: _Node, stop: float, out_records: list[RequestRecord],
                    out_idle: list[IdleCost], flush_all: bool) -> None:
        ledger = node.ledger
        start = ledger.closed_until
        if start is None:
            if not node.pending:
                return
            start = min(p.interval.prefill_start for p in node.pending)
            ledger.window_start = start
        if stop > start:
            price = self._prices.gpu_price(ledger.gpu_type).dollars_per_second
            result = close_window([p.interval for p in node.pending], start, stop,
                                  ledger.gpu_count, price, ledger.in_model_fraction)
            ledger.node_dollars += result.node_dollars
            ledger.attributed_dollars += result.attributed_dollars
            ledger.idle_dollars += result.idle_dollars
            ledger.closed_until = stop
            node.closed.extend(result.closed)
            horizon = stop - self._config.late_horizon_seconds
            while node.closed and node.closed[0].end < horizon:
                node.closed.popleft()
            out_idle.extend(_merge_idle(ledger.pool, result.idle_spans))
        closed_until = ledger.closed_until
        if closed_until is None:
            return
        done = [p for p in node.pending if flush_all or p.interval.end <= closed_until]
        if not done:
            return
        node.pending = [p for p in node.pending if not (flush_all or
                                                         p.interval.end <= closed_until)]
        done.sort(key=lambda p: p.interval.prefill_start)
        for item in done:
            self._finish(item)
            out_records.append(item.record)

    def _finish(self, item: _Pending) -> None:
        record, iv = item.record, item.interval
        assert record.prefill_start_unix is not None and record.decode_start_unix is not None
        assert record.engine_end_unix is not None
        prefill_seconds = record.decode_start_unix - record.prefill_start_unix
        decode_seconds = record.engine_end_unix - record.decode_start_unix
        land_gpu_cost(
            record,
            item.roofline,
            {Phase.PREFILL: prefill_seconds, Phase.DECODE: decode_seconds},
            iv.cost_by_phase,
            iv.average_decode_batch,
        )
        record.cache_miss_waste_dollars = self.cache.observe(
            record, iv.cost_by_phase.get(Phase.PREFILL, 0.0), item.roofline)
        record.cost_dollars = sum(t.cost_dollars for t in record.stages.values())


def _merge_idle(pool: str, spans: list[tuple[float, float, float]]) -> list[IdleCost]:
    merged: list[IdleCost] = []
    for start, end, dollars in spans:
        if merged and merged[-1].end_unix == start:
            last = merged[-1]
            merged[-1] = IdleCost(pool, last.start_unix, end, last.dollars + dollars)
        else:
            merged.append(IdleCost(pool, start, end, dollars))
    return merged
