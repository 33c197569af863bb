"""The event sweep (collector/cost/apportion.py) against a direct computation of the same
model, slice by slice and member by member (O(slices x batch), as the model reads); and
its results independent of arrival order and of when slices are closed."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpath.collector.cost.apportion import (
    DECODE_SLOPE_MIN_SECONDS,
    MIN_IN_MODEL_FRACTION,
    EngineInterval,
    GroupKey,
    NodeTimeline,
)
from tokenpath.roofline import Roofline, roofline_for
from tokenpath.stages import Phase

PRICE = 0.001  # $/GPU-second


def _direct(intervals: list[EngineInterval], node_gpus: int) -> dict[int, dict[Phase, float]]:
    """Each slice between consecutive engine events, each member's work computed from
    its own tokens and context at the slice's midpoint."""
    cuts = sorted({t for iv in intervals for t in (iv.prefill_start, iv.decode_start, iv.end)})
    out: dict[int, dict[Phase, float]] = defaultdict(dict)
    for a, b in pairwise(cuts):
        dt, mid = b - a, (a + b) / 2
        groups: dict[GroupKey, list[tuple[EngineInterval, Phase]]] = defaultdict(list)
        for iv in intervals:
            phase = iv.phase_at(mid)
            if phase is not None:
                groups[iv.group].append((iv, phase))
        if not groups:
            continue
        # an engine's GPUs (its largest TP), shared by its models' groups by their requests
        engine_gpus: dict[str, int] = defaultdict(int)
        for iv in intervals:
            engine_gpus[iv.group[0]] = max(engine_gpus[iv.group[0]], iv.gpus)
        engine_members: dict[str, int] = defaultdict(int)
        for key, members in groups.items():
            engine_members[key[0]] += len(members)
        demand = sum(engine_gpus[e] for e in engine_members)
        scale = min(1.0, node_gpus / demand)
        for key, members in groups.items():
            ratios = [iv.in_model_ratio for iv, _ in members if iv.in_model_ratio is not None]
            fraction = 1.0 if not ratios else min(1.0, max(MIN_IN_MODEL_FRACTION,
                                                              sum(ratios) / len(ratios)))
            share = len(members) / engine_members[key[0]]
            dollars = PRICE * engine_gpus[key[0]] * share * scale * dt * fraction
            weights = _weights(members, dt, mid, fraction)
            total = sum(weights)
            for (iv, phase), w in zip(members, weights, strict=True):
                out[iv.key][phase] = out[iv.key].get(phase, 0.0) + dollars * w / total
    return out


def _weights(members: list[tuple[EngineInterval, Phase]], dt: float, mid: float,
             fraction: float) -> list[float]:
    roofline: Roofline | None = members[0][0].roofline
    if roofline is None:
        return [1.0] * len(members)
    batch = len(members)
    ws = roofline.memory_seconds(roofline.model.weight_bytes / batch)
    per_step, extra = [], []
    dc = dm = pc = pm = pnv = 0.0
    decoders = 0
    for iv, phase in members:
        if phase is Phase.DECODE:
            short = iv.end - iv.decode_start < DECODE_SLOPE_MIN_SECONDS
            ctx = iv.context_at((iv.decode_start + iv.end) / 2 if short else mid)
            c = roofline.compute_seconds(roofline.decode_flops(ctx))  # type: ignore[arg-type]
            m = roofline.memory_seconds(roofline.decode_bytes(ctx))  # type: ignore[arg-type]
            dc, dm, decoders = dc + c, dm + m, decoders + 1
            per_step.append(c + m + ws)
            extra.append(0.0)
            continue
        n, cached = iv.new_tokens, iv.cached_tokens
        c = roofline.compute_seconds(roofline.prefill_flops(n, cached))
        m = roofline.memory_seconds(roofline.prefill_bytes(n, cached))
        if iv.prefill_steps is not None:
            dc, dm = dc + c / iv.prefill_steps, dm + m / iv.prefill_steps
            per_step.append((c + m) / iv.prefill_steps + ws)
            extra.append(0.0)
        else:
            share = dt / (iv.decode_start - iv.prefill_start)
            pc, pm = pc + c * share, pm + m * share
            pnv += roofline.nvlink_seconds(n) * share
            per_step.append(ws)
            extra.append((c + m) * share)
    steps = 1.0
    if pc > 0 or pm > 0:
        overhead = roofline.step_overhead_seconds + roofline.nvlink_seconds(decoders)
        busy = dt * fraction - pnv
        steps = max(1.0, min((busy - pc) / (overhead + dc),
                             (busy - pm) / (overhead + roofline.memory_seconds(
                                 roofline.model.weight_bytes) + dm)))
    return [steps * s + e for s, e in zip(per_step, extra, strict=True)]


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


def _close(a: dict[int, dict[Phase, float]], b: dict[int, dict[Phase, float]]) -> None:
    for key in set(a) | set(b):
        for phase in set(a.get(key, {})) | set(b.get(key, {})):
            x, y = a.get(key, {}).get(phase, 0.0), b.get(key, {}).get(phase, 0.0)
            assert math.isclose(x, y, rel_tol=1e-7, abs_tol=1e-12), (key, phase, x, y)


@settings(max_examples=80, deadline=None)
@given(intervals_strategy, st.integers(1, 12))
def test_the_sweep_equals_the_direct_computation(spec: list, node_gpus: int) -> None:
    intervals = _build(spec)
    swept, node, attributed = _sweep(intervals, [], node_gpus)
    _close(swept, _direct(_build(spec), node_gpus))
    assert attributed <= node * (1 + 1e-12)


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
