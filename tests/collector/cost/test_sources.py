"""A unit's forwarding sources (collector/cost/sources.py) and the attributor closing a unit
at the minimum of their progress: a progress message counts once its records are here,
the window waits for discovery, a silent source leaves the minimum (counted), a stopped
one leaves once its records are in, and a source running behind another never makes a
record late."""

from __future__ import annotations

import math

from testkit.fakes.clock import FakeClock
from tests.collector.cost.helpers import RecordingSink, engine_record
from tokenpath.collector.cost.attributor import AttributorConfig, CostAttributor
from tokenpath.collector.cost.prices import load_price_sheet
from tokenpath.collector.cost.sources import SourceProgress, UnitSources
from tokenpath.records import RequestRecord

DISCOVERY, TIMEOUT = 5.0, 30.0


def _watermark(sources: UnitSources, now: float, expired: list[str] | None = None) -> float | None:
    return sources.watermark(now, DISCOVERY, TIMEOUT,
                             (expired if expired is not None else []).append)


def test_progress_counts_only_once_its_records_are_held() -> None:
    sources = UnitSources(0.0)
    sources.progress(SourceProgress("u", "a", 2, 50.0), 0.0)  # overtook its two records
    assert _watermark(sources, 10.0) == -math.inf
    sources.record("a", 10.0)
    assert _watermark(sources, 10.0) == -math.inf
    sources.record("a", 10.0)
    assert _watermark(sources, 10.0) == 50.0
    # an older message arriving late never moves it back
    sources.progress(SourceProgress("u", "a", 1, 40.0), 11.0)
    assert _watermark(sources, 11.0) == 50.0


def test_the_window_waits_for_discovery_then_takes_the_minimum() -> None:
    sources = UnitSources(100.0)
    sources.progress(SourceProgress("u", "a", 0, 80.0), 100.0)
    assert _watermark(sources, 104.0) == -math.inf  # still discovering
    sources.progress(SourceProgress("u", "b", 0, 60.0), 104.5)
    assert _watermark(sources, 105.0) == 60.0
    sources.progress(SourceProgress("u", "b", 0, 90.0), 106.0)
    assert _watermark(sources, 106.0) == 80.0


def test_a_silent_source_leaves_the_minimum_counted_and_comes_back() -> None:
    sources = UnitSources(0.0)
    sources.progress(SourceProgress("u", "a", 0, 10.0), 0.0)
    sources.progress(SourceProgress("u", "b", 0, 50.0), 0.0)
    expired: list[str] = []
    for now in range(1, 40):  # b keeps reporting, a fell silent at 0
        sources.progress(SourceProgress("u", "b", 0, 50.0 + now), float(now))
        _watermark(sources, float(now), expired)
    assert expired == ["a"]  # counted once
    assert _watermark(sources, 39.0, expired) == 89.0
    sources.progress(SourceProgress("u", "a", 0, 20.0), 40.0)  # back: in the minimum again
    assert _watermark(sources, 40.0, expired) == 20.0


def test_a_stopped_source_leaves_once_its_records_are_in_and_none_left_falls_back() -> None:
    sources = UnitSources(0.0)
    sources.progress(SourceProgress("u", "a", 0, 10.0), 0.0)
    sources.progress(SourceProgress("u", "b", 1, 20.0, final=True), 6.0)
    assert _watermark(sources, 6.0) == -math.inf  # b's final waits for its record
    sources.record("b", 7.0)
    assert _watermark(sources, 7.0) == 10.0  # b left; a is the minimum
    sources.progress(SourceProgress("u", "a", 0, 30.0, final=True), 8.0)
    assert _watermark(sources, 8.0) is None  # nobody left: the caller's own rule
    # a stopped source that resumes is in the minimum again
    sources.progress(SourceProgress("u", "b", 2, 25.0), 9.0)
    sources.record("b", 9.0)
    assert _watermark(sources, 9.0) == 25.0


def _attributor(clock: FakeClock, sink: RecordingSink) -> CostAttributor:
    config = AttributorConfig(source_discovery_seconds=DISCOVERY,
                              source_timeout_seconds=TIMEOUT, tick_seconds=0)
    return CostAttributor(sink, load_price_sheet(), clock=clock, config=config)


def _traffic() -> list[RequestRecord]:
    return [engine_record(i, 900.0 + 0.5 * i, 0.4, 3.0 + i % 7) for i in range(40)]


def test_a_source_running_behind_makes_no_record_late() -> None:
    """Replica a forwards its records of node-a promptly; b's arrive 20 s after its last
    heartbeat (held back, under the source timeout), its heartbeats stalled meanwhile. The minimum
    over the sources waits for b, so none is priced late and the dollars are those of one
    collector given every record."""
    clock = FakeClock(1000.0)
    sharded, alone = RecordingSink(), RecordingSink()
    cost, lone = _attributor(clock, sharded), _attributor(clock, alone)
    for record in _traffic():
        lone.consume_record(record)
    lone.shutdown()
    records = _traffic()
    a, b = records[0::2], records[1::2]
    cost.consume_progress(SourceProgress("node-a", "b", 0, 880.0))  # b: known, behind
    for i, record in enumerate(a):
        clock.now += 0.5
        cost.consume_forwarded(record, "a")
        assert record.prefill_start_unix is not None
        cost.consume_progress(SourceProgress("node-a", "a", i + 1, record.prefill_start_unix))
        cost.tick()
    clock.now += 5.0
    cost.consume_progress(SourceProgress("node-a", "a", len(a), 990.0))
    cost.tick()
    assert len(sharded.records) == 0  # b's last word was 880: nothing of 900+ closes
    clock.now += 5.0
    for record in b:
        cost.consume_forwarded(record, "b")
    cost.consume_progress(SourceProgress("node-a", "b", len(b), 990.0))
    assert cost.stats.sources_expired.value == 0
    assert cost.stats.late_records.value == 0
    assert len(sharded.records) == len(records)  # both at 990: everything closed
    cost.shutdown()
    priced = {r.trace_id: r.gpu_cost_dollars for r in sharded.records}
    assert all(r.gpu_cost_dollars > 0 for r in alone.records)
    for record in alone.records:
        assert math.isclose(priced[record.trace_id], record.gpu_cost_dollars, rel_tol=1e-9)


def test_without_progress_the_source_behind_is_priced_late() -> None:
    """The same arrival order through one collector's own watermark (no sources): b's
    records miss the window; what the sources above prevent."""
    clock = FakeClock(1000.0)
    sink = RecordingSink()
    cost = _attributor(clock, sink)
    records = _traffic()
    for record in records[0::2]:
        clock.now += 0.5
        cost.consume_record(record)
        cost.tick()
    clock.now += 20.0
    cost.tick()
    for record in records[1::2]:
        cost.consume_record(record)
    cost.shutdown()
    assert cost.stats.late_records.value > 0


def test_a_silent_source_expires_and_the_unit_is_priced_without_it() -> None:
    clock = FakeClock(1000.0)
    sink = RecordingSink()
    cost = _attributor(clock, sink)
    cost.consume_progress(SourceProgress("node-a", "dead", 0, 800.0))
    for i, record in enumerate(_traffic()):
        cost.consume_forwarded(record, "live")
        cost.consume_progress(SourceProgress("node-a", "live", i + 1, 990.0))
    cost.tick()
    assert not sink.records  # the dead replica's last word holds the unit
    clock.now += TIMEOUT + 1.0
    cost.consume_progress(SourceProgress("node-a", "live", 40, 995.0))
    assert cost.stats.sources_expired.value == 1
    assert len(sink.records) == 40


def test_a_source_that_expired_then_delivers_is_late_and_keeps_conservation() -> None:
    """The late path as it happens: replica "dead" falls silent, leaves the minimum after
    the timeout, the unit closes on "live"'s progress, then "dead" delivers its records
    after all. They are priced late, from the closed slices' idle, and the unit's
    attributed + idle dollars still equal its GPUs' dollars (docs/cost-model.md)."""
    clock = FakeClock(1000.0)
    sink = RecordingSink()
    cost = _attributor(clock, sink)
    records = _traffic()
    live, dead = records[0::2], records[1::2]
    cost.consume_progress(SourceProgress("node-a", "dead", 0, 850.0))
    for i, record in enumerate(live):
        cost.consume_forwarded(record, "live")
        cost.consume_progress(SourceProgress("node-a", "live", i + 1, 990.0))
    clock.now += TIMEOUT + 1.0
    cost.consume_progress(SourceProgress("node-a", "live", len(live), 995.0))
    cost.tick()
    assert cost.stats.sources_expired.value == 1
    assert cost.stats.late_records.value == 0
    for record in dead:  # back after all, its records with it
        cost.consume_forwarded(record, "dead")
    cost.consume_progress(SourceProgress("node-a", "dead", len(dead), 995.0))
    cost.shutdown()
    assert cost.stats.late_records.value == len(dead)
    ledger = cost.ledger["node-a"]
    assert math.isclose(ledger.attributed_dollars + ledger.idle_dollars, ledger.node_dollars,
                        rel_tol=1e-9)
    attributed = sum(r.gpu_cost_dollars for r in sink.records)
    assert math.isclose(attributed + sink.idle_dollars, ledger.node_dollars, rel_tol=1e-9)
    assert cost.stats.late_dollars.value + cost.stats.late_unpriced_dollars.value > 0
