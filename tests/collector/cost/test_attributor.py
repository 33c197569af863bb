from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from testkit.fakes.clock import FakeClock
from tokenpath.collector.cost.attributor import AttributorConfig, CostAttributor
from tokenpath.collector.cost.prices import load_price_sheet, price_sheet_from_mapping
from tokenpath.records import StageTiming
from tokenpath.stages import GPU_STAGES, Phase, Provenance, StageId

from .helpers import RecordingSink, engine_record

PRICES = load_price_sheet()
H100_PER_SECOND = PRICES.gpus["H100-SXM"].dollars_per_hour / 3600.0
NO_TICKER = AttributorConfig(tick_seconds=0)
NO_DELAY = AttributorConfig(min_delay_seconds=0, max_delay_seconds=0, tick_seconds=0)


def attributor(sink: RecordingSink, clock: FakeClock | None = None,
               config: AttributorConfig | None = None) -> CostAttributor:
    return CostAttributor(sink, PRICES, clock=clock or FakeClock(), config=config or NO_TICKER)


workloads = st.lists(
    st.tuples(
        st.sampled_from(["node-a", "node-b"]),
        st.floats(0, 50),  # prefill start
        st.floats(0.0005, 3),  # prefill seconds
        st.floats(0, 20),  # decode seconds
        st.integers(1, 20_000),  # input tokens
        st.floats(0, 1),  # cached fraction
        st.integers(1, 2_000),  # output tokens
        st.sampled_from(["llama-3.1-8b", "llama-3.1-70b", "not-in-catalog"]),
        st.sampled_from([1, 2, 4]),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(workloads, st.randoms())
def test_attributed_plus_idle_equals_node_cost(workload: list, rng: object) -> None:
    sink = RecordingSink()
    cost = attributor(sink)
    records = [
        engine_record(i, 1e9 + ps, pf, dec, node=node, input_tokens=n,
                      cached_tokens=int(n * frac), output_tokens=out, model=model,
                      tensor_parallel=tp)
        for i, (node, ps, pf, dec, n, frac, out, model, tp) in enumerate(workload)
    ]
    rng.shuffle(records)  # type: ignore[attr-defined]
    for record in records:
        cost.consume_record(record)
    cost.shutdown()
    assert len(sink.records) == len(records)
    node_dollars = sum(ledger.node_dollars for ledger in cost.ledger.values())
    attributed = sum(r.gpu_cost_dollars for r in sink.records)
    assert math.isclose(attributed + sink.idle_dollars, node_dollars, rel_tol=1e-9)
    for record in sink.records:
        assert record.cost_dollars >= 0
        assert record.naive_cost_dollars >= 0
        for timing in record.stages.values():
            assert timing.cost_dollars >= 0 and timing.seconds >= 0
            for share in timing.phases.values():
                assert share.cost_dollars >= 0 and share.seconds >= 0
        in_model = record.engine_end_unix - record.prefill_start_unix  # type: ignore[operator]
        gpu_seconds = sum(record.stages[s].seconds for s in GPU_STAGES if s in record.stages)
        assert math.isclose(gpu_seconds, in_model, rel_tol=1e-9, abs_tol=1e-12)
    assert all(item.dollars >= 0 for item in sink.idle)


def test_two_overlapping_decodes_split_by_work_not_wall_clock() -> None:
    sink = RecordingSink()
    cost = attributor(sink)
    short_ctx = engine_record(0, 100.0, 0.05, 10.0, input_tokens=100, output_tokens=300)
    long_ctx = engine_record(1, 100.0, 0.05, 10.0, input_tokens=100_000, output_tokens=300)
    cost.consume_record(long_ctx)
    cost.consume_record(short_ctx)
    cost.shutdown()
    by_id = {r.trace_id: r for r in sink.records}
    # Same wall clock, but the long context reads far more KV cache: it pays more.
    assert by_id[long_ctx.trace_id].gpu_cost_dollars > by_id[short_ctx.trace_id].gpu_cost_dollars
    total = sum(r.gpu_cost_dollars for r in sink.records)
    assert math.isclose(total, 10.05 * H100_PER_SECOND, rel_tol=1e-9)
    # Naive counts the whole wall clock for each: twice the node's cost.
    naive = sum(r.naive_cost_dollars for r in sink.records)
    assert naive > 1.9 * total


def test_gap_between_requests_is_idle_cost_for_the_pool() -> None:
    sink = RecordingSink()
    cost = attributor(sink)
    cost.consume_record(engine_record(0, 10.0, 0.1, 1.9))
    cost.consume_record(engine_record(1, 15.0, 0.1, 0.9))
    cost.shutdown()
    assert [(i.pool, i.start_unix, i.end_unix) for i in sink.idle] == [("default", 12.0, 15.0)]
    assert math.isclose(sink.idle_dollars, 3.0 * H100_PER_SECOND, rel_tol=1e-12)


def test_records_are_held_until_the_watermark_passes() -> None:
    sink = RecordingSink()
    clock = FakeClock(1000.0)
    cost = attributor(sink, clock, AttributorConfig(max_delay_seconds=30, tick_seconds=0))
    cost.consume_record(engine_record(0, 990.0, 0.1, 5.0))
    assert sink.records == []  # its node's slices are not closed yet
    clock.now = 1030.0  # watermark 1000 > end 995.1
    cost.tick()
    assert [r.trace_id for r in sink.records] == [f"{1:032x}"]
    assert sink.records[0].gpu_cost_dollars > 0
    cost.shutdown()
    assert sink.shutdowns == 1
    cost.shutdown()  # idempotent
    assert sink.shutdowns == 1


def _conserved(cost: CostAttributor, sink: RecordingSink) -> None:
    """Attributed GPU dollars plus idle (its negative rows included) are the node dollars,
    in the sink and in the ledger."""
    attributed = sum(r.gpu_cost_dollars for r in sink.records)
    node = sum(ledger.node_dollars for ledger in cost.ledger.values())
    assert math.isclose(attributed + sink.idle_dollars, node, rel_tol=1e-9)
    for ledger in cost.ledger.values():
        assert math.isclose(ledger.attributed_dollars + ledger.idle_dollars,
                            ledger.node_dollars, rel_tol=1e-9)


def test_a_late_record_is_charged_from_the_idle_it_overlaps_and_counted() -> None:
    sink = RecordingSink()
    clock = FakeClock(1000.0)
    cost = attributor(sink, clock, NO_DELAY)
    cost.consume_record(engine_record(0, 900.0, 0.1, 50.0))  # its unit's events to 950.1
    cost.consume_record(engine_record(1, 980.0, 0.1, 10.0))  # to 990.1: closed up to there
    cost.consume_record(engine_record(2, 920.0, 0.1, 10.0))  # ended before the watermark
    cost.consume_record(engine_record(3, 960.0, 0.1, 10.0))  # in a slice that was idle
    cost.shutdown()
    assert cost.stats.late_records.value == 2
    late = {r.trace_id: r for r in sink.records}
    # its engine's one GPU was busy with record 0: no idle to charge it from; it would
    # have paid half the GPU over its 10.1 s, counted as unpriced
    assert late[f"{3:032x}"].gpu_cost_dollars == 0.0
    assert math.isclose(cost.stats.late_unpriced_dollars.value, 10.1 * H100_PER_SECOND / 2,
                        rel_tol=1e-9)
    # alone on the node (the slice was idle): the full rate of its GPU, taken off the idle
    assert math.isclose(late[f"{4:032x}"].gpu_cost_dollars, 10.1 * H100_PER_SECOND, rel_tol=1e-9)
    assert math.isclose(cost.stats.late_dollars.value, 10.1 * H100_PER_SECOND, rel_tol=1e-9)
    negative = [row for row in sink.idle if row.dollars < 0]
    assert [(r.start_unix, r.end_unix) for r in negative] == [(950.1, 980.0)]
    assert math.isclose(negative[0].dollars, -10.1 * H100_PER_SECOND, rel_tol=1e-9)
    assert negative[0].energy_joules < 0
    _conserved(cost, sink)


def test_gpu_stages_are_modeled_with_phases_and_keep_measured_dispatch() -> None:
    sink = RecordingSink()
    cost = attributor(sink)
    record = engine_record(0, 50.0, 0.2, 4.0, input_tokens=8000, output_tokens=200)
    record.stages[StageId.GPU_DISPATCH] = StageTiming(StageId.GPU_DISPATCH, 0.05,
                                                      Provenance.MEASURED)
    cost.consume_record(record)
    cost.shutdown()
    out = sink.records[0]
    assert out.stages[StageId.GPU_DISPATCH].provenance is Provenance.MEASURED
    assert math.isclose(out.stages[StageId.GPU_DISPATCH].seconds, 0.05, rel_tol=1e-9)
    kernel, hbm = out.stages[StageId.KERNEL_EXEC], out.stages[StageId.HBM_LOAD]
    assert kernel.provenance is Provenance.MODELED and hbm.provenance is Provenance.MODELED
    # prefill mostly kernel_exec, decode mostly hbm_load
    assert kernel.phases[Phase.PREFILL].seconds > hbm.phases[Phase.PREFILL].seconds
    assert hbm.phases[Phase.DECODE].seconds > kernel.phases[Phase.DECODE].seconds
    assert math.isclose(sum(t.seconds for s, t in out.stages.items() if s in GPU_STAGES), 4.2)


def test_tensor_parallel_gets_nvlink_time() -> None:
    sink = RecordingSink()
    cost = attributor(sink)
    cost.consume_record(engine_record(0, 1.0, 0.3, 3.0, model="llama-3.1-70b",
                                      tensor_parallel=4, input_tokens=4000))
    cost.shutdown()
    nvlink = sink.records[0].stages[StageId.NVLINK]
    assert nvlink.seconds > 0 and nvlink.cost_dollars > 0
    assert math.isclose(sink.records[0].gpu_cost_dollars, 3.3 * 4 * H100_PER_SECOND,
                        rel_tol=1e-9)


def test_cpu_and_network_stages_are_priced() -> None:
    prices = price_sheet_from_mapping({
        "gpus": {"H100-SXM": {"dollars_per_hour": 3.6}},
        "cpu": {"dollars_per_core_hour": 3.6},
        "network": {"dollars_per_gb": 1.0},
    })
    sink = RecordingSink()
    cost = CostAttributor(sink, prices, clock=FakeClock(), config=NO_TICKER)
    record = engine_record(0, 1.0, 0.1, 0.9)
    record.response_bytes = 2_000_000_000
    record.stages[StageId.API_GATEWAY] = StageTiming(StageId.API_GATEWAY, 0.5, Provenance.MEASURED)
    record.stages[StageId.SCHEDULER_QUEUE] = StageTiming(StageId.SCHEDULER_QUEUE, 2.0,
                                                         Provenance.MEASURED)
    record.stages[StageId.NIC_TX] = StageTiming(StageId.NIC_TX, 0.3, Provenance.DERIVED)
    record.stages[StageId.SWITCH_HOP] = StageTiming(StageId.SWITCH_HOP, 0.1, Provenance.DERIVED)
    cost.consume_record(record)
    cost.shutdown()
    out = sink.records[0]
    assert math.isclose(out.stages[StageId.API_GATEWAY].cost_dollars, 0.5 * 0.001)
    assert out.stages[StageId.SCHEDULER_QUEUE].cost_dollars == 0.0
    assert math.isclose(out.stages[StageId.NIC_TX].cost_dollars, 1.5)
    assert math.isclose(out.stages[StageId.SWITCH_HOP].cost_dollars, 0.5)
    assert math.isclose(out.cost_dollars, sum(t.cost_dollars for t in out.stages.values()))


def test_record_without_engine_timeline_passes_through_with_cpu_cost() -> None:
    sink = RecordingSink()
    cost = attributor(sink)
    record = engine_record(0, 1.0, 0.1, 0.9)
    record.prefill_start_unix = record.decode_start_unix = record.engine_end_unix = None
    record.stages[StageId.ROUTER] = StageTiming(StageId.ROUTER, 0.01, Provenance.MEASURED)
    cost.consume_record(record)
    assert sink.records == [record]  # not held: there is nothing to apportion
    assert record.stages[StageId.ROUTER].cost_dollars > 0
    assert cost.stats.without_timeline.value == 1
    cost.shutdown()


def test_node_inventory_charges_unused_gpus_as_idle() -> None:
    prices = price_sheet_from_mapping({
        "gpus": {"H100-SXM": {"dollars_per_hour": 3.6}},
        "nodes": {"big": {"gpu_type": "H100-SXM", "gpu_count": 8, "pool": "prod"}},
    })
    sink = RecordingSink()
    cost = CostAttributor(sink, prices, clock=FakeClock(), config=NO_TICKER)
    cost.consume_record(engine_record(0, 0.0, 0.5, 9.5, node="big", tensor_parallel=2))
    cost.shutdown()
    assert math.isclose(sink.records[0].gpu_cost_dollars, 10 * 2 * 0.001)
    assert math.isclose(sink.idle_dollars, 10 * 6 * 0.001)
    assert {i.pool for i in sink.idle} == {"prod"}


def test_engine_step_gaps_reported_out_of_model_become_idle() -> None:
    """An engine that reports in-model time below its wall time (a simulated engine summing
    its step times) leaves the GPU idle between steps: that share is idle, not charged."""
    sink = RecordingSink()
    cost = attributor(sink)
    record = engine_record(0, 100.0, 0.5, 8.0, output_tokens=100)
    # the engine span began at 97.375, queued 0.5 s: 10.625 s of wall time from scheduled
    # to end, of which the engine reports 8.5 s in-model
    record.engine_start_unix = 97.375
    record.queue_seconds = 0.5
    cost.consume_record(record)
    cost.shutdown()
    ledger = cost.ledger["node-a"]
    assert math.isclose(ledger.in_model_fraction, 0.8)
    out = sink.records[0]
    assert math.isclose(out.gpu_cost_dollars, 0.8 * 8.5 * H100_PER_SECOND, rel_tol=1e-9)
    assert sink.idle_dollars > 0
    assert math.isclose(out.gpu_cost_dollars + sink.idle_dollars, ledger.node_dollars,
                        rel_tol=1e-9)
    gpu_seconds = sum(out.stages[s].seconds for s in GPU_STAGES)
    assert math.isclose(gpu_seconds, 8.5)  # stage seconds stay the measured in-model time


def test_a_busy_node_never_holds_back_another_nodes_records() -> None:
    """Each pricing unit waits out its own lateness: node-a's long requests (a 196 s
    event-time lag) do not hold node-b's short one past node-b's own watermark."""
    sink = RecordingSink()
    clock = FakeClock(1000.0)
    cost = attributor(sink, clock, AttributorConfig(tick_seconds=0))
    cost.consume_record(engine_record(0, 800.0, 1.0, 195.0, node="node-a"))  # lag 196 s
    cost.consume_record(engine_record(1, 996.0, 0.1, 1.0, node="node-b"))  # lag 1.1 s
    assert cost.lateness_for("node-a") > 196 and cost.lateness_for("node-b") < 10
    # both quiet since: their watermarks move with the wall clock after min_delay_seconds
    clock.now = 1000.0 + cost.lateness_for("node-b") + AttributorConfig().min_delay_seconds + 1
    cost.tick()
    assert [r.node for r in sink.records] == ["node-b"]
    cost.shutdown()
    assert sorted(r.node or "" for r in sink.records) == ["node-a", "node-b"]


def test_a_request_longer_than_the_kept_slices_is_charged_from_their_idle() -> None:
    """A 20-minute request arrives after its node's slices closed and the oldest were
    dropped: the slices kept charge it from their idle; its part before them (whose idle
    is no longer known) is unpriced, counted, never charged on top."""
    sink = RecordingSink()
    clock = FakeClock(0.0)
    cost = attributor(sink, clock, AttributorConfig(tick_seconds=0, min_delay_seconds=0,
                                                    max_delay_seconds=0, late_horizon_seconds=0))
    for minute in range(21):  # short requests keep the node's slices closing
        clock.now = minute * 60.0 + 2.0
        cost.consume_record(engine_record(minute, minute * 60.0, 0.1, 0.9, node="node-a"))
    clock.now = 1201.0
    long = engine_record(100, 0.0, 1.0, 1199.0, node="node-a")
    cost.consume_record(long)
    cost.shutdown()
    assert cost.stats.late_records.value == 1
    priced = next(r for r in sink.records if r.trace_id == long.trace_id)
    charged, unpriced = cost.stats.late_dollars.value, cost.stats.late_unpriced_dollars.value
    assert math.isclose(priced.gpu_cost_dollars, charged, rel_tol=1e-9)
    # most of its 1,200 s lie before the slices kept (the last two seconds' worth)
    assert unpriced > 0.95 * 1200 * H100_PER_SECOND
    assert charged + unpriced <= 1200 * H100_PER_SECOND * (1 + 1e-9)
    _conserved(cost, sink)


def test_a_record_received_twice_is_priced_once() -> None:
    """A forwarded batch re-sent after a timeout the receiver had in fact taken."""
    sink = RecordingSink()
    cost = attributor(sink)
    once = engine_record(0, 10.0, 0.1, 1.9)
    cost.consume_record(once)
    cost.consume_record(engine_record(0, 10.0, 0.1, 1.9))  # the same record id again
    cost.shutdown()
    assert [r.record_id for r in sink.records] == [once.record_id]
    assert math.isclose(sink.records[0].gpu_cost_dollars, 2.0 * H100_PER_SECOND, rel_tol=1e-9)
    assert cost.stats.duplicates.value == 1
