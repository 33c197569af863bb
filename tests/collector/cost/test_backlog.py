"""A backlog is priced like live traffic (the event-time window, docs/cost-model.md).

The same ~30 s of engine traffic (tests/deploy/engine_traffic.py: two vLLM engines known
only by their resource and the demo's engine, overlapping continuous-batching timelines
as they export them) goes through the real decode, assembly and mapping, then reaches
the attributor twice: live (each record a few seconds after its request ended, as the
assembler hands it on) and ten minutes old in the same order at full speed, as an
upstream retry queue replays it after an outage. The clock is injected; the pipeline
worker's tick is called each time the clock passes a tick; once the last record is in,
the clock moves a tick at a time until nothing is held (a condition, not a duration)."""

from __future__ import annotations

import functools
import math
import random
from dataclasses import dataclass

import pytest

from testkit.fakes.clock import FakeClock
from tests.deploy.engine_traffic import engine_traffic, peak_in_flight
from tokenpath.collector.assembler import AssembledTrace, Assembler, AssemblerConfig
from tokenpath.collector.cost.attributor import AttributorConfig, CostAttributor
from tokenpath.collector.cost.prices import load_price_sheet
from tokenpath.collector.limits import IngestLimits
from tokenpath.collector.mapping import StageMapper
from tokenpath.collector.node_metrics import NodeMetricsState
from tokenpath.collector.receivers.ingest import OtlpIngest
from tokenpath.collector.stats import CollectorStats
from tokenpath.identity import pricing_unit
from tokenpath.records import RequestRecord

from .helpers import RecordingSink, engine_record

PRICES = load_price_sheet()
TRAFFIC_END = 1_750_000_000.0  # the live traffic ends just before this
PER_ENGINE = 150  # three engines at 5 requests a second: about 30 s of traffic, ~50 in
RPS = 5.0  # flight at the peak, requests of up to 27 s (ps to end)
# The allowed lateness covers the longest request from the first record on: the lag
# window learns a unit's longest request only once one has arrived, so under the default
# (5 s) the first long requests of a fresh unit miss their window, live as replayed.
CONFIG = AttributorConfig(min_delay_seconds=30.0)
ASSEMBLER_GRACE_SECONDS = 6.0  # a trace is handed on this long after its root arrived
EXPORT_JITTER_SECONDS = 2.0  # the SDKs' batch exporters: up to this long after the end
BACKLOG_AGE_SECONDS = 600.0
REPLAY_SECONDS_PER_RECORD = 20e-6  # full speed
TICK_SECONDS = 1.0  # the pipeline worker's tick (cost.tick_seconds)
MAX_TICKS_AFTER = 3600  # the loop's bound: the condition is nothing held


class _Records:
    def __init__(self) -> None:
        self.traces: list[AssembledTrace] = []
        self.records: list[RequestRecord] = []

    def consume_trace(self, trace: AssembledTrace) -> None:
        self.traces.append(trace)

    def consume_record(self, record: RequestRecord) -> None:
        self.records.append(record)

    def shutdown(self) -> None:
        pass


@functools.cache
def _traffic() -> tuple[RequestRecord, ...]:
    """The engines' spans through the collector's own decode, assembly and mapping, in
    the order a live collector hands the records on (end + export delay + grace)."""
    traffic = engine_traffic(TRAFFIC_END, per_engine=PER_ENGINE, rps=RPS)
    stats = CollectorStats()
    traces = _Records()
    assembler = Assembler(traces, AssemblerConfig(root_grace_seconds=3600,
                                                  idle_timeout_seconds=3600,
                                                  max_traces=10**6), stats)
    ingest = OtlpIngest(assembler, NodeMetricsState(), IngestLimits(), stats)
    ingest.export_trace_payload(traffic.request.SerializeToString(), "protobuf", "test")
    assembler.shutdown()
    mapped = _Records()
    mapper = StageMapper(mapped, stats)
    for trace in traces.traces:
        mapper.consume_trace(trace)
    records = [r for r in mapped.records if r.engine_end_unix is not None]
    assert len(records) == len(traffic.trace_ids)
    return tuple(sorted(records, key=_live_arrival))


def _copy(record: RequestRecord) -> RequestRecord:
    """A fresh copy to price (a compiled record does not deep-copy)."""
    return RequestRecord.from_json(record.to_json())


def _live_arrival(record: RequestRecord) -> float:
    assert record.engine_end_unix is not None
    jitter = random.Random(record.trace_id).uniform(0.0, EXPORT_JITTER_SECONDS)
    return record.engine_end_unix + jitter + ASSEMBLER_GRACE_SECONDS


@dataclass
class _Priced:
    cost: CostAttributor
    sink: RecordingSink
    out_while_arriving: int  # records out before the last one was in


class _Worker:
    """What the pipeline worker does for the attributor: records in, a tick each time
    the clock passes one."""

    def __init__(self, clock: FakeClock, config: AttributorConfig) -> None:
        self.clock = clock
        self.sink = RecordingSink()
        self.cost = CostAttributor(self.sink, PRICES, clock=clock, config=config)
        self.next_tick = clock.now + TICK_SECONDS

    def at(self, now: float) -> None:
        while self.next_tick <= now:
            self.clock.now = self.next_tick
            self.cost.tick()
            self.next_tick += TICK_SECONDS
        self.clock.now = now

    def until_nothing_held(self) -> None:
        for _ in range(MAX_TICKS_AFTER):
            if self.cost.pending_records == 0:
                return
            self.at(self.next_tick)
        raise AssertionError(f"{self.cost.pending_records} records still held")


def _price(arrivals: list[tuple[float, RequestRecord]],
           config: AttributorConfig | None = None) -> _Priced:
    worker = _Worker(FakeClock(arrivals[0][0]), config or CONFIG)
    for now, record in arrivals:
        worker.at(now)
        worker.cost.consume_record(record)
    out_while_arriving = len(worker.sink.records)
    worker.until_nothing_held()
    return _Priced(worker.cost, worker.sink, out_while_arriving)


def _live() -> list[tuple[float, RequestRecord]]:
    return [(_live_arrival(r), _copy(r)) for r in _traffic()]


def _backlog(records: tuple[RequestRecord, ...] | list[RequestRecord]
             ) -> list[tuple[float, RequestRecord]]:
    """The same records in the same order, all sent ``BACKLOG_AGE_SECONDS`` after the
    live traffic ended, back to back."""
    start = TRAFFIC_END + BACKLOG_AGE_SECONDS
    return [(start + i * REPLAY_SECONDS_PER_RECORD, _copy(r))
            for i, r in enumerate(records)]


def _conserved(priced: _Priced) -> None:
    attributed = sum(r.gpu_cost_dollars for r in priced.sink.records)
    node = sum(ledger.node_dollars for ledger in priced.cost.ledger.values())
    assert math.isclose(attributed + priced.sink.idle_dollars, node, rel_tol=1e-9)


def test_a_backlog_ten_minutes_old_is_priced_as_it_was_live() -> None:
    records = _traffic()
    assert len({(r.node, r.engine_id) for r in records}) == 3
    assert peak_in_flight(list(records)) >= 32  # real batch sizes
    live = _price(_live())
    backlog = _price(_backlog(records))
    for priced in (live, backlog):
        assert len(priced.sink.records) == len(records)
        assert priced.cost.stats.late_records.value == 0
        assert priced.cost.stats.late_dollars.value == 0.0
        _conserved(priced)
    # apportioned as they arrive, against their own engines' timelines: as many are out
    # by the time the last record is in as when the same traffic came live
    assert backlog.out_while_arriving >= live.out_while_arriving > 0
    live_by_id = {r.record_id: r for r in live.sink.records}
    for record in backlog.sink.records:
        other = live_by_id[record.record_id]
        assert record.gpu_cost_dollars > 0
        assert record.gpu_cost_dollars == pytest.approx(other.gpu_cost_dollars, rel=0.01)
        assert record.cost_dollars == pytest.approx(other.cost_dollars, rel=0.01)


def test_a_record_that_misses_its_window_in_a_backlog_is_priced_late() -> None:
    """One early request of the replay comes after the rest of the backlog: its unit's
    newest engine time is then past its engine start by more than the allowed lateness
    (the watermark passed it), so it is priced by the late rule, from the idle of the
    closed slices, the rest counted unpriced."""
    records = list(_traffic())
    missing = min(records, key=lambda r: r.prefill_start_unix or 0.0)
    records.remove(missing)
    assert missing.prefill_start_unix is not None
    arrivals = _backlog(records)
    worker = _Worker(FakeClock(arrivals[0][0]), CONFIG)
    for now, record in arrivals:
        worker.at(now)
        worker.cost.consume_record(record)
    unit = pricing_unit(missing.node, missing.engine_id)
    watermark = worker.cost.watermark_for(unit)
    assert watermark is not None and watermark > missing.prefill_start_unix
    worker.cost.consume_record(_copy(missing))
    worker.until_nothing_held()
    cost, sink = worker.cost, worker.sink
    assert cost.stats.late_records.value == 1
    late = next(r for r in sink.records if r.record_id == missing.record_id)
    charged, unpriced = cost.stats.late_dollars.value, cost.stats.late_unpriced_dollars.value
    assert charged + unpriced > 0
    assert charged <= late.gpu_cost_dollars * (1 + 1e-9)
    _conserved(_Priced(cost, sink, 0))
    # what it asked of the closed slices (its share as one more request of its engine)
    # plus its part after them: of the order of what it paid live
    live = {r.record_id: r for r in _price(_live()).sink.records}[missing.record_id]
    asked = late.gpu_cost_dollars + unpriced
    assert 0.2 * live.gpu_cost_dollars < asked < 5 * live.gpu_cost_dollars


def test_a_fresh_collector_prices_a_few_seconds_old_burst_without_late_records() -> None:
    """Eight overlapping requests on one node that ended about five seconds before they
    reach a fresh collector (cost.min_delay_seconds 0.3, max 2.0), all at once in time
    order: none is late, and the wall clock releases the last ones once the node is
    quiet."""
    now = 10_000.0
    records = [engine_record(i, now - 6.6 + 0.15 * i, 0.05, 1.2 + 0.05 * i)
               for i in range(8)]
    records.sort(key=lambda r: r.engine_end_unix or 0.0)
    config = AttributorConfig(min_delay_seconds=0.3, max_delay_seconds=2.0,
                              tick_seconds=0)
    worker = _Worker(FakeClock(now), config)
    for i, record in enumerate(records):
        worker.at(now + i * 1e-4)
        worker.cost.consume_record(record)
    worker.until_nothing_held()
    assert worker.cost.stats.late_records.value == 0
    assert len(worker.sink.records) == 8
    # each its work's share of the slices it was in: together, the node's busy time
    busy = max(r.engine_end_unix or 0.0 for r in records) - records[0].prefill_start_unix
    rate = PRICES.gpus["H100-SXM"].dollars_per_second
    assert sum(r.gpu_cost_dollars for r in worker.sink.records) == pytest.approx(
        busy * rate, rel=1e-9)


def test_a_quiet_units_watermark_moves_with_the_wall_clock_after_min_delay() -> None:
    """Event time stands still while a unit receives nothing; after min_delay_seconds of
    silence its watermark runs on with the wall clock, so its last records and its idle
    time come out."""
    clock = FakeClock(500.0)
    sink = RecordingSink()
    config = AttributorConfig(min_delay_seconds=5.0, tick_seconds=0)
    cost = CostAttributor(sink, PRICES, clock=clock, config=config)
    cost.consume_record(engine_record(0, 100.0, 0.1, 1.9))  # 100 to 102, 400 s old
    lateness = cost.lateness_for("node-a")
    assert lateness == pytest.approx(5.0)  # its 2 s lag + the margin, at least the minimum
    assert cost.watermark_for("node-a") == pytest.approx(102.0 - lateness)
    clock.now = 504.0  # not quiet yet: nothing moves
    cost.tick()
    assert cost.watermark_for("node-a") == pytest.approx(102.0 - lateness)
    assert sink.records == []
    clock.now = 505.0 + lateness + 3.0  # quiet for lateness + 3 s
    cost.tick()
    assert cost.watermark_for("node-a") == pytest.approx(105.0)
    assert [r.trace_id for r in sink.records] == [f"{1:032x}"]
    assert sink.idle_dollars == pytest.approx(3.0 * PRICES.gpus["H100-SXM"].dollars_per_second)
    # a record of that unit's closed time is now late; a newer one is not
    cost.consume_record(engine_record(1, 103.0, 0.1, 1.0))
    cost.consume_record(engine_record(2, 110.0, 0.1, 1.0))
    assert cost.stats.late_records.value == 1
    cost.shutdown()
    assert len(sink.records) == 3


def test_a_timestamp_far_ahead_of_the_clock_does_not_close_its_units_window() -> None:
    """Engine time counts no further than the collector's clock: a record stamped a day
    ahead moves its unit's watermark at most to the clock less the allowed lateness."""
    clock = FakeClock(1000.0)
    sink = RecordingSink()
    cost = CostAttributor(sink, PRICES, clock=clock, config=AttributorConfig(tick_seconds=0))
    cost.consume_record(engine_record(0, 990.0, 0.1, 5.0))
    cost.consume_record(engine_record(1, 86_400.0, 0.1, 5.0))  # a day ahead
    watermark = cost.watermark_for("node-a")
    assert watermark is not None
    assert watermark == pytest.approx(1000.0 - cost.lateness_for("node-a"))
    cost.consume_record(engine_record(2, 993.5, 0.1, 5.0))
    assert cost.stats.late_records.value == 0
    cost.shutdown()
    assert len(sink.records) == 3
