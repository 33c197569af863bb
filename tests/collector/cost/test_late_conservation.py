"""A record that misses its window (forced here: its engine start lies before its unit's
closed slices, as when its source expired and then delivered) keeps conservation: it is
charged only from the idle of the closed slices it overlaps, that idle goes downstream as
negative idle rows (the store sums them; Prometheus counts them on
tokenpath_idle_cost_reclaimed_dollars_total, both counters monotonic), and what the idle
cannot cover is counted as unpriced. Attributed + idle = node dollars to 1e-9, in the
attributor's ledger, in the store and on /metrics (docs/cost-model.md, "Late records")."""

from __future__ import annotations

import math
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from testkit.fakes.clock import FakeClock
from tokenpath import metric_names as M
from tokenpath.collector.cost.attributor import AttributorConfig, CostAttributor
from tokenpath.collector.cost.prices import price_sheet_from_mapping
from tokenpath.collector.fan_out import FanOut
from tokenpath.collector.prometheus_sink import PrometheusSink
from tokenpath.collector.store import RecordStore, StoreConfig
from tokenpath.collector.store.factory import open_store_readonly
from tokenpath.stages import GPU_STAGES

from .helpers import RecordingSink, engine_record

T = 1_790_000_000.0
RATE = 0.002  # $/GPU-second (7.2 $/h)
PRICES = price_sheet_from_mapping({
    "gpus": {"H100-SXM": {"dollars_per_hour": RATE * 3600}},
    # two GPUs, one engine of one: the other GPU is idle while the engine is busy
    "nodes": {"spare": {"gpu_type": "H100-SXM", "gpu_count": 2, "pool": "spare-pool"}},
})
CONFIG = AttributorConfig(min_delay_seconds=0, max_delay_seconds=0, lag_margin_seconds=0,
                          tick_seconds=0)


def _metric(text: str, series: str) -> float:
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == series)


def _gpu_dollars(text: str) -> float:
    gpu = {stage.value for stage in GPU_STAGES}
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == M.COST.series and s.labels[M.LABEL_STAGE] in gpu)


def test_a_forced_late_record_keeps_attributed_plus_idle_equal_to_node_dollars(
        tmp_path: Path) -> None:
    recording = RecordingSink()
    prometheus = PrometheusSink()
    path = str(tmp_path / "store.db")
    store = RecordStore(StoreConfig(path=path), clock=lambda: T + 1000.0)
    store.start()
    clock = FakeClock(T + 500.0)
    cost = CostAttributor(FanOut([recording, prometheus, store]), PRICES, clock=clock,
                          config=CONFIG)
    # node "spare" (two GPUs, its engine on one) and node "full" (one GPU, its engine's):
    # each busy 100-140, idle 140-150, busy 150-160; closed up to 160
    for node in ("spare", "full"):
        base = 0 if node == "spare" else 10
        cost.consume_record(engine_record(base, T + 100.0, 0.5, 39.5, node=node))
        cost.consume_record(engine_record(base + 1, T + 150.0, 0.5, 9.5, node=node))
        assert cost.ledger[node].closed_until == T + 160.0
    # late on both: 120 to 170, over busy slices, the idle one, and past the closed ones
    for node, index in (("spare", 2), ("full", 12)):
        cost.consume_record(engine_record(index, T + 120.0, 1.0, 49.0, node=node))
    assert cost.stats.late_records.value == 2
    cost.shutdown()  # the store too: everything written

    late = {r.node: r for r in recording.records if r.trace_id in (f"{3:032x}", f"{13:032x}")}
    # in each busy second it asks half its engine's GPU (it and the one running there);
    # in each idle second its GPU's full rate; 160 to 170 it is apportioned normally
    asked = (20 * 0.5 + 10 * 1.0 + 10 * 0.5) * RATE
    # "spare": its idle second GPU covers all it asks; "full": only the idle slice can
    spare_charged, full_charged = asked, 10 * RATE
    assert math.isclose(cost.ledger["spare"].late_dollars, spare_charged, rel_tol=1e-9)
    assert math.isclose(cost.ledger["spare"].late_unpriced_dollars, 0.0, abs_tol=1e-15)
    assert math.isclose(cost.ledger["full"].late_dollars, full_charged, rel_tol=1e-9)
    assert math.isclose(cost.ledger["full"].late_unpriced_dollars, asked - full_charged,
                        rel_tol=1e-9)
    assert math.isclose(cost.stats.late_dollars.value, spare_charged + full_charged,
                        rel_tol=1e-9)
    assert math.isclose(cost.stats.late_unpriced_dollars.value, asked - full_charged,
                        rel_tol=1e-9)
    for node, charged in (("spare", spare_charged), ("full", full_charged)):
        # what it was charged from the closed slices, plus its normal share after them
        assert late[node].gpu_cost_dollars > charged

    node_dollars = sum(ledger.node_dollars for ledger in cost.ledger.values())
    assert math.isclose(node_dollars, (2 + 1) * (T + 170.0 - (T + 100.0)) * RATE, rel_tol=1e-9)
    # the attributor's ledger, per node
    for ledger in cost.ledger.values():
        assert math.isclose(ledger.attributed_dollars + ledger.idle_dollars,
                            ledger.node_dollars, rel_tol=1e-9)
    # what went downstream: the records' GPU dollars and the idle rows, negative included
    attributed = sum(r.gpu_cost_dollars for r in recording.records)
    negative = [row for row in recording.idle if row.dollars < 0]
    assert negative and all(row.energy_joules <= 0 for row in negative)
    assert math.isclose(-sum(row.dollars for row in negative), spare_charged + full_charged,
                        rel_tol=1e-9)
    assert math.isclose(attributed + recording.idle_dollars, node_dollars, rel_tol=1e-9)
    # the store sums the negative rows with the others
    reader = open_store_readonly(path)
    try:
        stored = sum(r.gpu_cost_dollars for r in reader.records())
        assert math.isclose(stored + reader.idle_cost_dollars(), node_dollars, rel_tol=1e-9)
    finally:
        reader.shutdown()
    # Prometheus: both idle counters only grow; idle less reclaimed is the net idle
    text = prometheus.render()
    idle = _metric(text, M.IDLE_COST.series)
    reclaimed = _metric(text, M.IDLE_COST_RECLAIMED.series)
    assert math.isclose(reclaimed, spare_charged + full_charged, rel_tol=1e-9)
    assert math.isclose(_gpu_dollars(text) + idle - reclaimed, node_dollars, rel_tol=1e-9)
