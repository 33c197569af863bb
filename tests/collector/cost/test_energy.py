"""Energy apportioned like dollars: modeled from the GPU's TDP where nothing is measured,
and labelled modeled wherever it shows."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from testkit.fakes.clock import FakeClock
from tokenpath import attributes as A
from tokenpath import metric_names as M
from tokenpath import views
from tokenpath.collector.cost.attributor import AttributorConfig, CostAttributor
from tokenpath.collector.cost.energy import (
    ENERGY_MEASURED,
    ENERGY_MODELED,
    IDLE_POWER_FRACTION,
    GpuEnergyReadings,
)
from tokenpath.collector.cost.prices import load_price_sheet
from tokenpath.collector.receivers.otlp_decode import MetricPoint
from tokenpath.query import Window
from tokenpath.records import RequestRecord
from tokenpath.roofline import GPUS

from .helpers import RecordingSink, engine_record

PRICES = load_price_sheet()
GPU = "H100-SXM"


def _priced() -> tuple[RecordingSink, CostAttributor]:
    sink = RecordingSink()
    cost = CostAttributor(sink, PRICES, clock=FakeClock(),
                          config=AttributorConfig(tick_seconds=0))
    # overlapping requests on one TP=2 engine, and a gap with nothing running
    for i, (start, prefill, decode) in enumerate(((0.0, 0.3, 2.0), (0.5, 0.2, 1.5),
                                                  (1.0, 0.4, 3.0), (9.0, 0.1, 0.5))):
        cost.consume_record(engine_record(i, start, prefill, decode, gpu_type=GPU,
                                          tensor_parallel=2))
    cost.shutdown()
    return sink, cost


def test_busy_and_idle_joules_account_for_every_gpu_second_of_the_window() -> None:
    sink, cost = _priced()
    per_second = PRICES.gpu_price(GPU).dollars_per_second
    watts = GPUS[GPU].tdp_watts
    for record in sink.records:
        assert record.energy_provenance == ENERGY_MODELED
        assert record.energy_joules == pytest.approx(
            record.gpu_cost_dollars / per_second * watts, rel=1e-9)
    busy_gpu_seconds = sum(r.energy_joules for r in sink.records) / watts
    idle_gpu_seconds = sum(i.energy_joules for i in sink.idle) / (watts * IDLE_POWER_FRACTION)
    (ledger,) = cost.ledger.values()
    assert ledger.window_start is not None and ledger.closed_until is not None
    window_gpu_seconds = (ledger.closed_until - ledger.window_start) * ledger.gpu_count
    assert busy_gpu_seconds + idle_gpu_seconds == pytest.approx(window_gpu_seconds, rel=1e-9)
    assert idle_gpu_seconds > 0  # the gap


def test_the_report_labels_modeled_energy() -> None:
    sink, _ = _priced()
    with views.over_records(sink.records, sink.idle) as queries:
        report = views.report_view(queries, Window()).to_json()
    assert report["energy_provenance"] == ENERGY_MODELED
    assert report["energy_joules"] == pytest.approx(sum(r.energy_joules for r in sink.records))
    assert report["idle_energy_joules"] > 0
    assert report["energy_joules_per_output_token"] > 0


# -- measured energy -----------------------------------------------------------------------

NODE = "node-a"


def _point(t: float, joules: float, gpu: str = "0", node: str = NODE) -> MetricPoint:
    return MetricPoint(M.GPU_ENERGY.name, joules, int(t * 1e9), {M.LABEL_GPU: gpu},
                       {A.NODE: node}, True)


def _counter_points(power: dict[str, Callable[[float], float]], start: float, end: float,
                    step: float) -> list[MetricPoint]:
    """Each GPU's cumulative joules every ``step`` seconds, its power a function of time
    (integrated with the trapezoid rule between samples, as the readings interpolate)."""
    points: list[MetricPoint] = []
    for gpu, watts in power.items():
        total, t = 1.0e6, start  # a counter that started long ago
        points.append(_point(t, total, gpu))
        while t < end:
            nxt = min(end, t + step)
            total += (watts(t) + watts(nxt)) / 2 * (nxt - t)
            points.append(_point(nxt, total, gpu))
            t = nxt
    return points


def test_readings_interpolate_between_samples_and_sum_the_gpus() -> None:
    readings = GpuEnergyReadings()
    readings.consume_points([_point(10.0, 100.0), _point(12.0, 300.0),
                             _point(10.0, 0.0, "1"), _point(12.0, 50.0, "1")])
    assert readings.known_until(NODE) == 12.0
    assert readings.joules(NODE, 10.5, 11.5) == pytest.approx(100.0 + 25.0)
    assert readings.joules(NODE, 9.0, 11.0) is None  # before the first sample
    assert readings.joules(NODE, 11.0, 13.0) is None  # past the last
    assert readings.joules("other", 10.0, 11.0) is None


def test_a_restarted_counter_continues_and_an_old_sample_is_refused() -> None:
    readings = GpuEnergyReadings()
    readings.consume_points([_point(10.0, 500.0), _point(11.0, 600.0), _point(12.0, 40.0),
                             _point(11.5, 1.0)])
    assert readings.stats.readings["counter_reset"] == 1
    assert readings.stats.readings["out_of_order"] == 1
    assert readings.joules(NODE, 10.0, 12.0) == pytest.approx(100.0 + 40.0)


def _batch_records(n: int) -> list[RequestRecord]:
    """``n`` requests on one TP=2 engine, overlapping at batch sizes in the hundreds, then
    a gap with nothing running and a last short burst."""
    out = []
    for i in range(n):
        start = 0.02 * i
        out.append(engine_record(i, 100.0 + start, 0.05 + 0.001 * (i % 7),
                                 2.0 + 0.01 * (i % 13), gpu_type=GPU, tensor_parallel=2,
                                 input_tokens=500 + 37 * (i % 11), output_tokens=60 + i % 40))
    for j in range(20):
        out.append(engine_record(n + j, 120.0 + 0.01 * j, 0.03, 0.5, gpu_type=GPU,
                                 tensor_parallel=2))
    return out


def _measured(records: list[RequestRecord], readings: GpuEnergyReadings,
              clock: FakeClock) -> tuple[RecordingSink, CostAttributor]:
    sink = RecordingSink()
    cost = CostAttributor(sink, PRICES, clock=clock,
                          config=AttributorConfig(tick_seconds=0, min_delay_seconds=1.0),
                          energy=readings)
    final = clock.now
    for record in sorted(records, key=lambda r: r.engine_end_unix or 0.0):
        assert record.engine_end_unix is not None
        clock.now = record.engine_end_unix + 0.5  # each arrives just after it ended
        cost.consume_record(record)
    clock.now = final
    return sink, cost


def test_measured_joules_are_apportioned_and_with_idle_add_up_to_the_meter() -> None:
    readings = GpuEnergyReadings()
    readings.consume_points(_counter_points(
        {"0": lambda t: 400.0 + 150.0 * math.sin(t), "1": lambda t: 250.0 + t % 3.0},
        90.0, 140.0, 0.25))
    clock = FakeClock(150.0)  # the watermark is past the readings, within the max wait
    sink, cost = _measured(_batch_records(300), readings, clock)
    cost.tick()
    assert len(sink.records) == 320
    (ledger,) = cost.ledger.values()
    assert ledger.window_start is not None and ledger.closed_until is not None
    assert ledger.closed_until == pytest.approx(140.0)  # held at the readings' end
    metered = readings.joules(NODE, ledger.window_start, ledger.closed_until)
    assert metered is not None and ledger.modeled_seconds == 0.0
    busy = sum(r.energy_joules for r in sink.records)
    idle = sum(i.energy_joules for i in sink.idle)
    assert busy + idle == pytest.approx(metered, rel=1e-9)
    assert ledger.measured_joules == pytest.approx(metered, rel=1e-9)
    assert {r.energy_provenance for r in sink.records} == {ENERGY_MEASURED}
    assert idle > 0  # the gap between the bursts
    # the same shares as the dollars: joules per dollar is the same for requests that
    # lived through the same slices, and it is the meter's, not the TDP's
    per_second = PRICES.gpu_price(GPU).dollars_per_second
    modeled = sum(r.gpu_cost_dollars for r in sink.records) / per_second * GPUS[GPU].tdp_watts
    assert busy < 0.9 * modeled  # drawing 250-550 W of a 700 W TDP
    cost.shutdown()


def test_closing_waits_for_the_readings_then_models_past_the_max_wait() -> None:
    readings = GpuEnergyReadings()
    readings.consume_points(_counter_points({"0": lambda t: 300.0}, 90.0, 102.5, 0.5))
    clock = FakeClock(200.0)
    sink, cost = _measured(_batch_records(50), readings, clock)
    cost.tick()
    (ledger,) = cost.ledger.values()
    # 200 - 1 s delay is past the readings by more than the 30 s max wait: not held
    assert cost.stats.energy_waits_expired.value >= 1
    assert ledger.modeled_seconds > 0 and ledger.measured_seconds > 0
    assert {r.energy_provenance for r in sink.records} == {ENERGY_MEASURED, ENERGY_MODELED}
    cost.shutdown()

    readings = GpuEnergyReadings()
    readings.consume_points(_counter_points({"0": lambda t: 300.0}, 90.0, 102.5, 0.5))
    clock = FakeClock(115.0)  # its watermark is within the max wait of the readings
    sink, cost = _measured(_batch_records(50), readings, clock)
    cost.tick()
    (ledger,) = cost.ledger.values()
    # closed to its last engine event within the readings
    assert ledger.closed_until is not None and 102.0 < ledger.closed_until <= 102.5
    assert ledger.modeled_seconds == 0.0
    held = len(sink.records)
    assert 0 < held < 70  # those ending after 102.5 s wait for the readings
    readings.consume_points(_counter_points({"0": lambda t: 300.0}, 102.5, 130.0, 0.5)[1:])
    clock.now = 131.0
    cost.tick()
    assert len(sink.records) == 70 > held
    assert {r.energy_provenance for r in sink.records} == {ENERGY_MEASURED}
    cost.shutdown()
