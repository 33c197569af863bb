"""The event sweep (collector/cost/apportion.py) against a direct computation of the same
model, slice by slice and member by member (testkit/pricing_oracle.py, as the model
reads); each group's dollars the node-slice rule's; and its results independent of
arrival order and of when slices are closed."""

from __future__ import annotations

import math
import random
from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from testkit.pricing_oracle import group_slice_dollars, node_slice_dollars
from tokenpath.collector.cost.apportion import EngineInterval, NodeTimeline
from tokenpath.roofline import roofline_for
from tokenpath.stages import Phase

PRICE = 0.001  # $/GPU-second


ROOFLINES = {name: roofline_for("H100-SXM", name, tp) for name, tp in
             (("llama-3.1-8b", 1), ("llama-3.1-70b", 4))}

intervals_strategy = st.lists(
    st.tuples(
        st.sampled_from(["e0", "e1"]),
        st.sampled_from(["llama-3.1-8b", "llama-3.1-70b", None]),
        st.floats(0, 20), st.floats(0.001, 2), st.floats(0, 10),
        st.integers(1, 30_000), st.floats(0, 1), st.integers(0, 1500),
        st.one_of(st.none(), st.integers(1, 12)),
        st.one_of(st.none(), st.floats(0.3, 1.0)),
    ),
    min_size=1, max_size=40,
)


def _build(spec: list[tuple]) -> list[EngineInterval]:  # type: ignore[type-arg]
    out = []
    for key, (engine, model, start, prefill, decode, n, frac, out_tokens, steps,
              ratio) in enumerate(spec):
        roofline = ROOFLINES.get(model) if model else None
        gpus = roofline.tensor_parallel if roofline else 1
        out.append(EngineInterval(
            key=key, group=(engine, model or "other", "H100-SXM", gpus), roofline=roofline,
            prefill_start=start, decode_start=start + prefill, end=start + prefill + decode,
            input_tokens=n, cached_tokens=int(n * frac), output_tokens=out_tokens,
            gpus=gpus, prefill_steps=None if steps is None else float(steps),
            in_model_ratio=ratio))
    return out


def _sweep(intervals: list[EngineInterval], stops: list[float], node_gpus: int
           ) -> tuple[dict[int, dict[Phase, float]], float, float]:
    timeline = NodeTimeline(PRICE, node_gpus, 100_000, 1e9)
    for iv in intervals:
        assert timeline.add(iv)
    node = attributed = 0.0
    finished = []
    for stop in stops:
        result = timeline.advance(stop)
        node, attributed = node + result.node_dollars, attributed + result.attributed_dollars
        finished += result.finished
    result = timeline.flush()
    node, attributed = node + result.node_dollars, attributed + result.attributed_dollars
    finished += result.finished
    assert sorted(iv.key for iv in finished) == sorted(iv.key for iv in intervals)
    return {iv.key: dict(iv.cost_by_phase) for iv in finished}, node, attributed


def _close(a: dict[int, dict[Phase, float]], b: dict[int, dict[Phase, float]],
           rel: float = 1e-7) -> None:
    for key in set(a) | set(b):
        for phase in set(a.get(key, {})) | set(b.get(key, {})):
            x, y = a.get(key, {}).get(phase, 0.0), b.get(key, {}).get(phase, 0.0)
            assert math.isclose(x, y, rel_tol=rel, abs_tol=1e-12 * rel / 1e-7), (
                key, phase, x, y)


@settings(max_examples=80, deadline=None)
@given(intervals_strategy, st.integers(1, 12))
def test_the_sweep_equals_the_direct_computation(spec: list, node_gpus: int) -> None:
    intervals = _build(spec)
    swept, node, attributed = _sweep(intervals, [], node_gpus)
    _close(swept, group_slice_dollars(_build(spec), node_gpus, PRICE), 1e-9)
    assert attributed <= node * (1 + 1e-12)


@settings(max_examples=60, deadline=None)
@given(intervals_strategy, st.integers(1, 12))
def test_each_groups_dollars_are_the_node_slice_rules(spec: list, node_gpus: int) -> None:
    """Only the split within a group changed with group slices: a group's (an engine's
    model's) dollars are what the node-slice rule gave it."""
    swept, _, _ = _sweep(_build(spec), [], node_gpus)
    before = node_slice_dollars(_build(spec), node_gpus, PRICE)
    totals: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0])  # type: ignore[type-arg]
    for iv in _build(spec):
        totals[iv.group][0] += sum(swept.get(iv.key, {}).values())
        totals[iv.group][1] += sum(before.get(iv.key, {}).values())
    for group, (now, then) in totals.items():
        assert math.isclose(now, then, rel_tol=1e-9, abs_tol=1e-15), group


@settings(max_examples=60, deadline=None)
@given(intervals_strategy, st.randoms(), st.lists(st.floats(0, 35), max_size=8))
def test_dollars_do_not_depend_on_arrival_order_or_when_slices_close(
        spec: list, rng: random.Random, stops: list[float]) -> None:
    ordered, _, _ = _sweep(_build(spec), [], 4)
    shuffled = _build(spec)
    rng.shuffle(shuffled)
    # every record is in before the first close; then closes at arbitrary watermarks, as
    # another collector's clock would place them
    again, _, _ = _sweep(shuffled, sorted(stops), 4)
    _close(ordered, again)


@settings(max_examples=40, deadline=None)
@given(intervals_strategy, st.integers(1, 5))
def test_rebasing_the_sums_changes_no_dollar(spec: list, every: int) -> None:
    """The prefix sums are moved to the present every REBASE_SLICES slices (members bank
    their share so far): doing it every few slices gives the same dollars."""
    import tokenpath.collector.cost.apportion as apportion

    unrebased, _, _ = _sweep(_build(spec), [], 4)
    saved = apportion.REBASE_SLICES
    apportion.REBASE_SLICES = every
    try:
        rebased, _, _ = _sweep(_build(spec), [], 4)
    finally:
        apportion.REBASE_SLICES = saved
    _close(unrebased, rebased)


def test_a_long_busy_timeline_prices_the_same_request_the_same() -> None:
    """A node busy without a break (its group never empties, so the sums are only ever
    rebased, never emptied): in steady state a request late in the run pays what the same
    request paid earlier, to rounding."""
    period, count = 7, 6000
    timeline = NodeTimeline(PRICE, 1, 1000, 1e9)
    for key in range(count):  # ~200 in flight at once, a request every 10 ms
        start = 1_700_000_000.0 + key * 0.01
        assert timeline.add(EngineInterval(
            key=key, group=("e0", "llama-3.1-8b", "H100-SXM", 1),
            roofline=ROOFLINES["llama-3.1-8b"], prefill_start=start,
            decode_start=start + 0.05, end=start + 2.05, input_tokens=800 + key % period,
            cached_tokens=100, output_tokens=100, gpus=1))
    dollars = {iv.key: sum(iv.cost_by_phase.values()) for iv in timeline.flush().finished}
    early, late = 1000, 1000 + period * 600
    for j in range(period):
        assert math.isclose(dollars[early + j], dollars[late + j], rel_tol=1e-7)
