"""cost.close_step_seconds: a record closes its unit's slices only once the watermark has
moved that far since the unit's last close. Fewer closes must not change a dollar: the
same overlapping traffic, arriving as a live collector sees it (each record a little
after its engine finished it, the clock moving a millisecond a record), is priced with
a close on every record and with the default step, and every figure is compared."""

from __future__ import annotations

import math
import random

import pytest

from testkit.fakes.clock import FakeClock
from tests.deploy.engine_traffic import peak_in_flight
from tokenpath.collector.cost.attributor import (
    DEFAULT_CLOSE_STEP_SECONDS,
    AttributorConfig,
    CostAttributor,
)
from tokenpath.collector.cost.prices import load_price_sheet
from tokenpath.config import ConfigError
from tokenpath.records import RequestRecord

from .helpers import RecordingSink, engine_record

RECORDS = 3000  # over SPREAD_SECONDS on two nodes: about 200 in flight at a time
SPREAD_SECONDS = 30.0
ARRIVAL_LAG_SECONDS = 0.5  # the span's arrival after the engine finished it
SECONDS_PER_ARRIVAL = 0.001


def _overlapping(seed: int) -> list[RequestRecord]:
    rng = random.Random(seed)
    records = [
        engine_record(i, rng.uniform(0, SPREAD_SECONDS), rng.uniform(0.01, 0.4),
                      rng.uniform(0.05, 4.0),
                      node=rng.choice(["node-a", "node-b"]),
                      input_tokens=rng.randint(50, 8000), output_tokens=rng.randint(2, 600),
                      cached_tokens=rng.choice([0, 0, 512]))
        for i in range(RECORDS)
    ]
    return sorted(records, key=lambda r: r.engine_end_unix or 0.0)


def _price(records: list[RequestRecord], step: float
           ) -> tuple[CostAttributor, RecordingSink, int, int]:
    """The records priced as they arrive, then a tick; also how many records came out
    before the tick, and how many times a record's close moved a unit's window."""
    sink = RecordingSink()
    clock = FakeClock()
    config = AttributorConfig(tick_seconds=0, min_delay_seconds=1.0, close_step_seconds=step)
    cost = CostAttributor(sink, load_price_sheet(), clock=clock, config=config)
    window_moves = 0
    closed: dict[str, float | None] = {}
    for record in records:
        assert record.engine_end_unix is not None
        clock.now = max(clock.now + SECONDS_PER_ARRIVAL,
                        record.engine_end_unix + ARRIVAL_LAG_SECONDS)
        cost.consume_record(record)
        now_closed = {name: ledger.closed_until for name, ledger in cost.ledger.items()}
        window_moves += sum(1 for name, until in now_closed.items()
                            if until != closed.get(name))
        closed = now_closed
    out_before_tick = len(sink.records)
    clock.now += 3600.0
    cost.tick()  # what the pipeline worker's ticker does: everything due comes out
    assert cost.pending_records == 0
    cost.shutdown()
    return cost, sink, out_before_tick, window_moves


@pytest.mark.parametrize("seed", [1, 2])
def test_the_close_step_changes_no_dollar_of_overlapping_traffic(seed: int) -> None:
    assert peak_in_flight(_overlapping(seed)) >= 150  # real batch sizes
    every, every_sink, every_early, every_moves = _price(_overlapping(seed), 0.0)
    stepped, stepped_sink, stepped_early, stepped_moves = _price(
        _overlapping(seed), DEFAULT_CLOSE_STEP_SECONDS)
    # the step closed far less often, on the same traffic...
    assert stepped_moves * 3 < every_moves
    # ...and most records still came out before the final tick (a record waits at most
    # one step longer)
    assert RECORDS // 2 < stepped_early <= every_early
    assert len(every_sink.records) == len(stepped_sink.records) == RECORDS
    assert every.stats.late_records.value == stepped.stats.late_records.value == 0
    by_id = {r.record_id: r for r in every_sink.records}
    for record in stepped_sink.records:
        other = by_id[record.record_id]
        assert math.isclose(record.cost_dollars, other.cost_dollars, rel_tol=1e-9)
        assert math.isclose(record.gpu_cost_dollars, other.gpu_cost_dollars, rel_tol=1e-9)
        assert math.isclose(record.cache_miss_waste_dollars, other.cache_miss_waste_dollars,
                            rel_tol=1e-9, abs_tol=1e-15)
        assert record.energy_joules is not None and other.energy_joules is not None
        assert math.isclose(record.energy_joules, other.energy_joules, rel_tol=1e-9)
    assert math.isclose(stepped_sink.idle_dollars, every_sink.idle_dollars, rel_tol=1e-9)
    for name, ledger in every.ledger.items():
        assert math.isclose(stepped.ledger[name].node_dollars, ledger.node_dollars,
                            rel_tol=1e-9)


def test_a_record_held_by_the_step_comes_out_at_the_next_tick() -> None:
    sink = RecordingSink()
    clock = FakeClock(100.0)
    cost = CostAttributor(sink, load_price_sheet(), clock=clock,
                          config=AttributorConfig(tick_seconds=0, min_delay_seconds=0,
                                                  max_delay_seconds=0, lag_margin_seconds=0,
                                                  close_step_seconds=10.0))
    cost.consume_record(engine_record(0, 10.0, 0.1, 1.0))  # closes to 11.1: out
    assert len(sink.records) == 1
    clock.now = 101.0
    # its unit's watermark moves to 12.6, short of the step (21.1): held
    cost.consume_record(engine_record(1, 12.0, 0.1, 0.5))
    assert len(sink.records) == 1 and cost.pending_records == 1
    cost.tick()
    assert len(sink.records) == 2 and cost.pending_records == 0


def test_a_negative_close_step_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"cost\.close_step_seconds"):
        AttributorConfig(close_step_seconds=-1.0).validate()
