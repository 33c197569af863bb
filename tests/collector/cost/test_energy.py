"""Energy apportioned like dollars: modeled from the GPU's TDP where nothing is measured,
and labelled modeled wherever it shows."""

from __future__ import annotations

import pytest

from tokenpath.collector.cost.attributor import AttributorConfig, CostAttributor
from tokenpath.collector.cost.energy import ENERGY_MODELED, IDLE_POWER_FRACTION
from tokenpath.collector.cost.prices import load_price_sheet
from tokenpath.report import build_report
from tokenpath.roofline import GPUS

from .helpers import FakeClock, RecordingSink, engine_record

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
    report = build_report(sink.records, sink.idle_dollars,
                          sum(i.energy_joules for i in sink.idle)).to_json()
    assert report["energy_provenance"] == ENERGY_MODELED
    assert report["energy_joules"] == pytest.approx(sum(r.energy_joules for r in sink.records))
    assert report["idle_energy_joules"] > 0
    assert report["energy_joules_per_output_token"] > 0
