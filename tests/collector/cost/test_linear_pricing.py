"""Pricing linear in engine events whatever the number of models on a node, in bounded
steps (collector/cost/apportion.py, collector/cost/attributor.py; docs/cost-model.md,
"Linear time" and "Bounded steps").

- The event sweep equals a brute-force oracle of its slicing (testkit/pricing_oracle.py)
  to 1e-9 on random traffic with 1 to 3,000 models on one node.
- Against the node-slice rule it replaced: every group's (model's) dollars are the same
  to 1e-9; each request's within 1e-3 where the step count cancels or every prefill's is
  measured; a node with one group (one engine, one model) prices every request the same
  to 1e-9.
- A counting hook: no step closes more than ``max_slices_per_step`` slices or prices
  more than ``max_records_per_step`` records, through a burst of 3,000 requests of
  distinct models and through a 100,000-record backlog; and the steps change no dollar.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict

import pytest

from testkit.fakes.clock import FakeClock
from testkit.pricing_oracle import group_slice_dollars, node_slice_dollars
from testkit.pricing_traffic import backlog, burst, closing_record
from tokenpath.collector.cost.apportion import EngineInterval, GroupKey, NodeTimeline
from tokenpath.collector.cost.attributor import AttributorConfig, CostAttributor
from tokenpath.collector.cost.prices import load_price_sheet
from tokenpath.records import RequestRecord
from tokenpath.roofline import roofline_for
from tokenpath.stages import Phase

from .helpers import RecordingSink

PRICE = 0.001  # $/GPU-second
LLAMA_8B = roofline_for("H100-SXM", "llama-3.1-8b", 1)
LLAMA_70B_TP4 = roofline_for("H100-SXM", "llama-3.1-70b", 4)
ENGINES = ("e0", "e1", "e2")  # e1 serves the 70B model on four GPUs


def _traffic(seed: int, models: int, requests: int, spread: float = 6.0,
             known_steps: bool = False) -> list[EngineInterval]:
    """``requests`` overlapping requests on one node's three engines, each on one of
    ``models`` models (adapters of the 8B model on e0 and e2, of the 70B one on e1, and
    one in five outside the catalog), prefills with and without a measured step count,
    engines with and without an in-model ratio."""
    rng = random.Random(seed)
    out = []
    for key in range(requests):
        model = key % models
        engine = ENGINES[model % len(ENGINES)]
        roofline = LLAMA_70B_TP4 if engine == "e1" else (None if model % 5 == 4 else LLAMA_8B)
        gpus = roofline.tensor_parallel if roofline else 1
        start = rng.uniform(0.0, spread)
        prefill = rng.uniform(0.005, 0.4)
        decode = rng.choice([0.0, rng.uniform(0.05, 4.0)])
        tokens = rng.randint(16, 8000)
        steps = (float(rng.randint(1, 8)) if known_steps
                 else rng.choice([None, None, float(rng.randint(1, 8))]))
        out.append(EngineInterval(
            key=key, group=(engine, f"adapter-{model}", "H100-SXM", gpus), roofline=roofline,
            prefill_start=start, decode_start=start + prefill, end=start + prefill + decode,
            input_tokens=tokens, cached_tokens=rng.choice([0, 0, tokens // 2]),
            output_tokens=rng.randint(1, 600), gpus=gpus, prefill_steps=steps,
            in_model_ratio=rng.choice([None, rng.uniform(0.4, 1.0)])))
    return out


def _sweep(intervals: list[EngineInterval], node_gpus: int | None, budget: int = -1
           ) -> tuple[dict[int, dict[Phase, float]], float, float, float]:
    """Every request's dollars by phase; the node's, attributed and idle dollars."""
    timeline = NodeTimeline(PRICE, node_gpus, 100_000, 1e9)
    for iv in intervals:
        assert timeline.add(iv)
    node = attributed = idle = 0.0
    finished: list[EngineInterval] = []
    while True:
        result = timeline.flush(budget)
        node += result.node_dollars
        attributed += result.attributed_dollars
        idle += result.idle_dollars
        finished += result.finished
        if result.done:
            break
    assert sorted(iv.key for iv in finished) == sorted(iv.key for iv in intervals)
    return {iv.key: dict(iv.cost_by_phase) for iv in finished}, node, attributed, idle


def _assert_close(got: dict[int, dict[Phase, float]], want: dict[int, dict[Phase, float]],
                  rel: float) -> None:
    for key in set(got) | set(want):
        for phase in set(got.get(key, {})) | set(want.get(key, {})):
            x, y = got.get(key, {}).get(phase, 0.0), want.get(key, {}).get(phase, 0.0)
            assert math.isclose(x, y, rel_tol=rel, abs_tol=1e-15), (key, phase, x, y)


def _by_group(dollars: dict[int, dict[Phase, float]], intervals: list[EngineInterval]
              ) -> dict[GroupKey, float]:
    out: dict[GroupKey, float] = defaultdict(float)
    for iv in intervals:
        out[iv.group] += sum(dollars.get(iv.key, {}).values())
    return out


@pytest.mark.parametrize(("models", "requests"),
                         [(1, 600), (3, 600), (40, 1500), (300, 2000), (3000, 3000)])
@pytest.mark.parametrize("node_gpus", [None, 3])
def test_the_sweep_equals_the_brute_force_oracle(models: int, requests: int,
                                                 node_gpus: int | None) -> None:
    intervals = _traffic(models + requests, models, requests)
    assert len({iv.group for iv in intervals}) == min(models, requests)
    swept, node, attributed, idle = _sweep(intervals, node_gpus)
    _assert_close(swept, group_slice_dollars(_traffic(models + requests, models, requests),
                                             node_gpus, PRICE), 1e-9)
    # conservation: what the members got is what the slices attributed; plus idle, the node
    members = sum(sum(phases.values()) for phases in swept.values())
    assert math.isclose(members, attributed, rel_tol=1e-9)
    assert math.isclose(attributed + idle, node, rel_tol=1e-9)


def test_bounded_advances_close_to_the_same_dollars() -> None:
    """The same traffic closed ten slices or events at a time."""
    intervals = _traffic(7, 300, 1200)
    whole, node, attributed, _ = _sweep(intervals, None)
    stepped, node_again, attributed_again, _ = _sweep(_traffic(7, 300, 1200), None, budget=10)
    _assert_close(stepped, whole, 1e-12)
    assert math.isclose(node, node_again, rel_tol=1e-12)
    assert math.isclose(attributed, attributed_again, rel_tol=1e-12)


@pytest.mark.parametrize(("models", "requests"), [(1, 400), (30, 600), (300, 600)])
def test_against_the_node_slice_rule(models: int, requests: int) -> None:
    """Only how a group's dollars are split among its members changed: each group's
    total is the node-slice rule's; each request's too within 1e-3 where no prefill of
    unknown step count shares a group slice with others' events (the step solve over a
    node slice shorter than a step counted a whole step)."""
    for known_steps in (False, True):
        intervals = _traffic(requests, models, requests, known_steps=known_steps)
        swept, *_ = _sweep(intervals, 5)
        before = node_slice_dollars(_traffic(requests, models, requests,
                                             known_steps=known_steps), 5, PRICE)
        groups, groups_before = _by_group(swept, intervals), _by_group(before, intervals)
        for group, dollars in groups.items():
            assert math.isclose(dollars, groups_before[group], rel_tol=1e-9), group
        if models == 1:  # one group on the node: its slices are the node's
            _assert_close(swept, before, 1e-9)
        elif known_steps:
            _assert_close(swept, before, 1e-3)


# --- bounded steps -----------------------------------------------------------------------

PRICES = load_price_sheet()
STEP_SLICES = 400
STEP_RECORDS = 100


class _Steps:
    """The counting hook: every step's slices closed and records priced."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, int]] = []

    def __call__(self, slices: int, records: int) -> None:
        self.steps.append((slices, records))

    def check(self) -> None:
        assert self.steps
        assert max(s for s, _ in self.steps) <= STEP_SLICES
        assert max(r for _, r in self.steps) <= STEP_RECORDS


def _priced(records: list[RequestRecord], config: AttributorConfig, at: float,
            deferred: bool) -> tuple[CostAttributor, RecordingSink, _Steps]:
    """``records`` handed over back to back at ``at`` on a still clock; with ``deferred``
    as the pipeline worker drives it (a step at a time after each record), else each
    call running its own steps."""
    sink = RecordingSink()
    cost = CostAttributor(sink, PRICES, clock=FakeClock(at), config=config)
    steps = _Steps()
    cost.step_observer = steps
    if deferred:
        cost.yield_between_steps(lambda: None)
    for record in records:
        cost.consume_record(record)
        while cost.step():
            pass
    cost.shutdown()
    return cost, sink, steps


@pytest.mark.parametrize("models", [1, 3000])
def test_a_burst_of_3000_models_closes_in_bounded_steps(models: int) -> None:
    start = 1_000_000.0
    records = burst(start, 3000, models)
    records.append(closing_record(records[-1], 60.0))
    config = AttributorConfig(tick_seconds=0, min_delay_seconds=20.0, max_delay_seconds=30.0,
                              max_slices_per_step=STEP_SLICES,
                              max_records_per_step=STEP_RECORDS)
    cost, sink, steps = _priced(records, config, start + 100.0, deferred=True)
    steps.check()
    assert cost.stats.late_records.value == 0
    assert len(sink.records) == 3001
    # the closing record's arrival closed the whole burst: 9,000 events in full steps
    assert sum(s for s, _ in steps.steps) >= 6000
    assert sum(1 for s, r in steps.steps if s == STEP_SLICES or r == STEP_RECORDS) >= 20
    # the steps change no dollar: the same records, each call closing all it can
    unbounded = AttributorConfig(tick_seconds=0, min_delay_seconds=20.0,
                                 max_delay_seconds=30.0, max_slices_per_step=10**9,
                                 max_records_per_step=10**9)
    records = burst(start, 3000, models)
    records.append(closing_record(records[-1], 60.0))
    _, whole, _ = _priced(records, unbounded, start + 100.0, deferred=False)
    by_id = {r.record_id: r.gpu_cost_dollars for r in whole.records}
    for record in sink.records:
        assert math.isclose(record.gpu_cost_dollars, by_id[record.record_id], rel_tol=1e-9)
    assert math.isclose(sink.idle_dollars, whole.idle_dollars, rel_tol=1e-9)


def test_a_100000_record_backlog_is_priced_in_bounded_steps() -> None:
    now = 2_000_000.0
    records = backlog(now - 600.0, 100_000)
    config = AttributorConfig(tick_seconds=0, max_slices_per_step=STEP_SLICES,
                              max_records_per_step=STEP_RECORDS)
    sink = RecordingSink()
    cost = CostAttributor(sink, PRICES, clock=FakeClock(now), config=config)
    steps = _Steps()
    cost.step_observer = steps
    cost.yield_between_steps(lambda: None)
    for i, record in enumerate(records):  # in forwarded batches, as the worker takes them
        cost.consume_record(record)
        if i % STEP_RECORDS == STEP_RECORDS - 1:
            while cost.step():
                pass
    cost.shutdown()
    steps.check()
    assert len(sink.records) == 100_000
    assert cost.stats.late_records.value == 0
    assert sum(r for _, r in steps.steps) == 100_000
    attributed = sum(r.gpu_cost_dollars for r in sink.records)
    node = sum(ledger.node_dollars for ledger in cost.ledger.values())
    assert math.isclose(attributed + sink.idle_dollars, node, rel_tol=1e-9)
