"""Brute-force oracles of the GPU-dollar apportionment (docs/cost-model.md section 3), read
straight from the model's definition, slice by slice and member by member, for the tests
of the event sweep (collector/cost/apportion.py). Neither uses the sweep's prefix sums.

- :func:`group_slice_dollars`: the rule the sweep implements. Node slices (cut at every
  engine event on the node) give each busy engine its GPUs' dollars, shared by its groups
  (models) by their requests, each scaled by its in-model fraction; a group's dollars
  over one of its own slices (cut at its own members' events only) are split among its
  members by their work over that slice, at its length and midpoint.
- :func:`node_slice_dollars`: the rule before, every node slice's group dollars split
  among the group's members at that node slice's length and midpoint. The two agree
  where a group's slices are the node's (one group per node); elsewhere only the split
  within a group differs, never a group's total.

Cost: O(node slices x engines x log n + sum over groups of their slices x members).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from itertools import pairwise

from tokenpath.collector.cost.apportion import (
    DECODE_SLOPE_MIN_SECONDS,
    MIN_IN_MODEL_FRACTION,
    EngineInterval,
    GroupKey,
)
from tokenpath.roofline import Roofline
from tokenpath.stages import Phase

Dollars = dict[int, dict[Phase, float]]  # interval key -> phase -> dollars


def _fraction(members: list[tuple[EngineInterval, Phase]]) -> float:
    ratios = [iv.in_model_ratio for iv, _ in members if iv.in_model_ratio is not None]
    if not ratios:
        return 1.0
    return min(1.0, max(MIN_IN_MODEL_FRACTION, sum(ratios) / len(ratios)))


def work_weights(members: list[tuple[EngineInterval, Phase]], dt: float, mid: float,
                 fraction: float) -> list[float]:
    """Each member's roofline work over a group slice ``dt`` long at midpoint ``mid``."""
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


def _cuts(intervals: list[EngineInterval]) -> list[float]:
    return sorted({t for iv in intervals for t in (iv.prefill_start, iv.decode_start, iv.end)})


def _engine_gpus(intervals: list[EngineInterval]) -> dict[str, int]:
    """An engine's GPUs: the largest tensor parallelism among its requests."""
    gpus: dict[str, int] = defaultdict(int)
    for iv in intervals:
        gpus[iv.group[0]] = max(gpus[iv.group[0]], iv.gpus)
    return gpus


def _split(out: Dollars, members: list[tuple[EngineInterval, Phase]], dollars: float,
           dt: float, mid: float, fraction: float) -> None:
    weights = work_weights(members, dt, mid, fraction)
    total = sum(weights)
    for (iv, phase), w in zip(members, weights, strict=True):
        out[iv.key][phase] = out[iv.key].get(phase, 0.0) + dollars * w / total


def group_slice_dollars(intervals: list[EngineInterval], node_gpus: int | None,
                        price: float) -> Dollars:
    """Each request's dollars by phase under the group-slice rule (module docstring).
    ``node_gpus``: the node's inventory (None: its engines' GPUs, never retired here)."""
    cuts = _cuts(intervals)
    gpus = _engine_gpus(intervals)
    starts: dict[str, list[float]] = defaultdict(list)
    ends: dict[str, list[float]] = defaultdict(list)
    for iv in intervals:
        starts[iv.group[0]].append(iv.prefill_start)
        ends[iv.group[0]].append(iv.end)
    for values in (*starts.values(), *ends.values()):
        values.sort()
    # per engine, its dollars per request summed over the node slices up to each cut
    running: dict[str, list[float]] = {e: [0.0] for e in gpus}
    for a, b in pairwise(cuts):
        mid = (a + b) / 2
        requests = {e: bisect_right(starts[e], mid) - bisect_right(ends[e], mid) for e in gpus}
        busy = [e for e, n in requests.items() if n > 0]
        demand = sum(gpus[e] for e in busy)
        have = node_gpus if node_gpus is not None else sum(gpus.values())
        scale = min(1.0, have / demand) if demand else 0.0
        for e in gpus:
            rate = price * gpus[e] * scale * (b - a) / requests[e] if requests[e] else 0.0
            running[e].append(running[e][-1] + rate)
    at = {t: i for i, t in enumerate(cuts)}
    by_group: dict[GroupKey, list[EngineInterval]] = defaultdict(list)
    for iv in intervals:
        by_group[iv.group].append(iv)
    out: Dollars = defaultdict(dict)
    for key, group in by_group.items():
        engine_running = running[key[0]]
        for a, b in pairwise(_cuts(group)):
            mid = (a + b) / 2
            members = [(iv, phase) for iv in group if (phase := iv.phase_at(mid)) is not None]
            if not members:
                continue
            fraction = _fraction(members)
            dollars = len(members) * fraction * (engine_running[at[b]] - engine_running[at[a]])
            _split(out, members, dollars, b - a, mid, fraction)
    return out


def node_slice_dollars(intervals: list[EngineInterval], node_gpus: int,
                       price: float) -> Dollars:
    """Each request's dollars by phase under the node-slice rule (module docstring)."""
    out: Dollars = defaultdict(dict)
    gpus = _engine_gpus(intervals)
    for a, b in pairwise(_cuts(intervals)):
        dt, mid = b - a, (a + b) / 2
        groups: dict[GroupKey, list[tuple[EngineInterval, Phase]]] = defaultdict(list)
        for iv in intervals:
            phase = iv.phase_at(mid)
            if phase is not None:
                groups[iv.group].append((iv, phase))
        if not groups:
            continue
        engine_members: dict[str, int] = defaultdict(int)
        for key, members in groups.items():
            engine_members[key[0]] += len(members)
        demand = sum(gpus[e] for e in engine_members)
        scale = min(1.0, node_gpus / demand)
        for key, members in groups.items():
            fraction = _fraction(members)
            share = len(members) / engine_members[key[0]]
            dollars = price * gpus[key[0]] * share * scale * dt * fraction
            _split(out, members, dollars, dt, mid, fraction)
    return out
