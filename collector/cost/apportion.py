"""Apportionment of a node's GPU time among the requests active on it (SPEC section 5).

The node timeline is cut at every request's engine events (scheduled, first token, done).
Between two cuts the set of active sequences is fixed, so the slice is a run of engine
steps with one batch composition. The slice's GPU dollars are split among the engine groups
active on the node by the GPUs they occupy (unoccupied GPUs are idle), and within a group
among its sequences by their roofline work in the slice:

- a decoding sequence does ``S`` steps of ``sequence_work(decode_flops(ctx),
  decode_bytes(ctx), B)``: its own KV cache plus a ``1/B`` share of the weights;
- a prefilling sequence whose step count ``K`` the engine measured (chunked prefill; from
  its per-phase gpu_dispatch) does ``S`` steps of ``1/K`` of its prefill FLOPs and KV bytes
  plus a weight share; otherwise the fraction ``dt / prefill_duration`` of them, plus ``S``
  weight shares;
- ``S`` (steps in the slice) is solved from the roofline step time when a prefill is in
  the slice: ``dt = Nv + S * (overhead + nv_d) + max(Pc + S * Cd, Pm + S * (W + Md))``
  (``Pc, Pm, Nv``: the prefill compute, memory and all-reduce seconds placed in the slice
  by time fraction; ``Cd, Md, nv_d``: one step's decode compute, memory and all-reduce
  seconds; ``W``: streaming the weights). The max of two increasing lines reaches ``dt``
  at the smaller of their two solutions; at least one step. Without a prefill ``S``
  cancels out.

Everything here is modeled (provenance ``modeled``); the inputs are measured timestamps.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from itertools import pairwise

from tokenpath.roofline import Roofline
from tokenpath.stages import Phase

GroupKey = tuple[str, str, int]  # (model, gpu type, tensor parallel)
IDLE_ROUNDING_FLOOR = 1e-12  # relative; below this a slice's leftover is float rounding


@dataclass(slots=True)
class EngineInterval:
    """One request's engine timeline on a node, and what it accumulated so far."""

    key: int
    group: GroupKey
    roofline: Roofline | None  # None: model not in the catalog, equal split
    prefill_start: float
    decode_start: float
    end: float
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    gpus: int
    cost_by_phase: dict[Phase, float] = field(default_factory=dict)
    decode_batch_seconds: float = 0.0  # integral of batch size over decode time
    decode_seconds_seen: float = 0.0
    prefill_steps: float | None = None  # engine steps of its prefill, when measured

    @property
    def new_tokens(self) -> int:
        return max(1, self.input_tokens - self.cached_tokens)

    def phase_at(self, t: float) -> Phase | None:
        if self.prefill_start <= t < self.decode_start:
            return Phase.PREFILL
        if self.decode_start <= t < self.end:
            return Phase.DECODE
        return None

    def context_at(self, t: float) -> float:
        """Tokens in the KV cache at time ``t`` of the decode phase (linear in time)."""
        span = self.end - self.decode_start
        done = (t - self.decode_start) / span if span > 0 else 1.0
        return float(self.input_tokens) + 1.0 + max(0, self.output_tokens - 1) * done

    @property
    def average_decode_batch(self) -> float:
        if self.decode_seconds_seen <= 0:
            return 1.0
        return self.decode_batch_seconds / self.decode_seconds_seen


@dataclass(slots=True)
class GroupSummary:
    """What one engine group did in a closed slice, kept to price late records."""

    total_work: float
    steps: float
    batch: int
    dollars: float


@dataclass(slots=True)
class ClosedSlice:
    start: float
    end: float
    groups: dict[GroupKey, GroupSummary] = field(default_factory=dict)


@dataclass(slots=True)
class SliceResult:
    """What closing one window of a node produced."""

    node_dollars: float = 0.0
    attributed_dollars: float = 0.0
    idle_dollars: float = 0.0
    idle_spans: list[tuple[float, float, float]] = field(default_factory=list)
    closed: list[ClosedSlice] = field(default_factory=list)


def _group_weights(members: list[tuple[EngineInterval, Phase]], dt: float, mid: float,
                   in_model_fraction: float = 1.0) -> tuple[list[float], float]:
    """Roofline work of each member of one engine group in a slice of length ``dt``, of
    which ``in_model_fraction`` was engine steps."""
    roofline = members[0][0].roofline
    if roofline is None:
        return [1.0] * len(members), 1.0
    batch = len(members)
    weight_share = roofline.memory_seconds(roofline.model.weight_bytes / batch)
    decode_compute = decode_memory = 0.0
    prefill_compute = prefill_memory = prefill_nvlink = 0.0
    decoders = 0
    per_step: list[float] = []
    prefill_part: list[float] = []
    for interval, phase in members:
        if phase is Phase.DECODE:
            ctx = int(interval.context_at(mid))
            c = roofline.compute_seconds(roofline.decode_flops(ctx))
            m = roofline.memory_seconds(roofline.decode_bytes(ctx))
            decode_compute += c
            decode_memory += m
            decoders += 1
            per_step.append(c + m + weight_share)
            prefill_part.append(0.0)
        elif interval.prefill_steps is not None:
            # measured step count: each of its steps does 1/K of the prefill
            n, cached = interval.new_tokens, interval.cached_tokens
            c = roofline.compute_seconds(roofline.prefill_flops(n, cached)) / interval.prefill_steps
            m = roofline.memory_seconds(roofline.prefill_bytes(n, cached)) / interval.prefill_steps
            decode_compute += c  # per step, like a decoder
            decode_memory += m
            per_step.append(c + m + weight_share)
            prefill_part.append(0.0)
        else:
            duration = interval.decode_start - interval.prefill_start
            frac = dt / duration if duration > 0 else 1.0
            n, cached = interval.new_tokens, interval.cached_tokens
            c = roofline.compute_seconds(roofline.prefill_flops(n, cached)) * frac
            m = roofline.memory_seconds(roofline.prefill_bytes(n, cached)) * frac
            prefill_compute += c
            prefill_memory += m
            prefill_nvlink += roofline.nvlink_seconds(n) * frac  # linear in tokens
            per_step.append(weight_share)
            prefill_part.append(c + m)
    steps = 1.0
    if prefill_compute > 0 or prefill_memory > 0:
        overhead = roofline.step_overhead_seconds + roofline.nvlink_seconds(decoders)
        weights = roofline.memory_seconds(roofline.model.weight_bytes)
        # step time in the slice; the prefill tokens' all-reduces lengthen the steps
        busy = dt * in_model_fraction - prefill_nvlink
        by_compute = (busy - prefill_compute) / (overhead + decode_compute)
        by_memory = (busy - prefill_memory) / (overhead + weights + decode_memory)
        steps = max(1.0, min(by_compute, by_memory))
    return [steps * s + p for s, p in zip(per_step, prefill_part, strict=True)], steps


def close_window(
    intervals: list[EngineInterval],
    start: float,
    stop: float,
    node_gpus: int,
    dollars_per_gpu_second: float,
    in_model_fraction: float = 1.0,
) -> SliceResult:
    """Apportion the node's GPU dollars over ``[start, stop)`` among ``intervals``.

    ``in_model_fraction`` is the share of the engine's elapsed time it reports as in-model
    (its step loop's host-side gaps are GPU idle time); only that share of an active
    slice is apportioned, the rest is idle.

    Adds each interval's share to its ``cost_by_phase``; time (and GPUs) no request used
    is returned as idle. attributed + idle == node dollars by construction.
    """
    result = SliceResult()
    if stop <= start:
        return result
    cuts = {start, stop}
    for iv in intervals:
        for t in (iv.prefill_start, iv.decode_start, iv.end):
            if start < t < stop:
                cuts.add(t)
    bounds = sorted(cuts)
    node_rate = node_gpus * dollars_per_gpu_second
    pending = sorted(
        (iv for iv in intervals if iv.prefill_start < stop and iv.end > start),
        key=lambda iv: iv.prefill_start,
    )
    next_index = 0
    active: list[EngineInterval] = []
    for a, b in pairwise(bounds):
        dt = b - a
        node_dollars = node_rate * dt
        result.node_dollars += node_dollars
        mid = a + dt / 2.0
        closed = ClosedSlice(a, b)
        result.closed.append(closed)
        while next_index < len(pending) and pending[next_index].prefill_start <= mid:
            active.append(pending[next_index])
            next_index += 1
        active = [iv for iv in active if iv.end > mid]
        groups: dict[GroupKey, list[tuple[EngineInterval, Phase]]] = defaultdict(list)
        for iv in active:
            phase = iv.phase_at(mid)
            if phase is not None:
                groups[iv.group].append((iv, phase))
        if not groups:
            result.idle_dollars += node_dollars
            result.idle_spans.append((a, b, node_dollars))
            continue
        demanded = {key: float(members[0][0].gpus) for key, members in groups.items()}
        total_demand = sum(demanded.values())
        scale = min(1.0, node_gpus / total_demand)
        used_dollars = 0.0
        for key, members in groups.items():
            group_dollars = (node_dollars * demanded[key] * scale / node_gpus
                             * in_model_fraction)
            weights, steps = _group_weights(members, dt, mid, in_model_fraction)
            total = sum(weights)
            if total <= 0:
                weights, total = [1.0] * len(members), float(len(members))
            closed.groups[key] = GroupSummary(total, steps, len(members), group_dollars)
            for (iv, phase), w in zip(members, weights, strict=True):
                share = group_dollars * w / total
                iv.cost_by_phase[phase] = iv.cost_by_phase.get(phase, 0.0) + share
                if phase is Phase.DECODE:
                    iv.decode_batch_seconds += len(members) * dt
                    iv.decode_seconds_seen += dt
            used_dollars += group_dollars
        result.attributed_dollars += used_dollars
        idle = node_dollars - used_dollars
        if idle > node_dollars * IDLE_ROUNDING_FLOOR:
            result.idle_dollars += idle
            result.idle_spans.append((a, b, idle))
    return result


def _late_work(iv: EngineInterval, phase: Phase, summary: GroupSummary, seconds: float,
               part: float, mid: float) -> float:
    """The late interval's work in ``part`` (a fraction, ``seconds`` long) of a closed slice."""
    roofline = iv.roofline
    if roofline is None:
        return part
    weight_share = roofline.memory_seconds(roofline.model.weight_bytes / (summary.batch + 1))
    steps = summary.steps * part
    if phase is Phase.DECODE:
        ctx = int(iv.context_at(mid))
        return steps * (roofline.compute_seconds(roofline.decode_flops(ctx))
                        + roofline.memory_seconds(roofline.decode_bytes(ctx)) + weight_share)
    duration = iv.decode_start - iv.prefill_start
    n, cached = iv.new_tokens, iv.cached_tokens
    prefill = (roofline.compute_seconds(roofline.prefill_flops(n, cached))
               + roofline.memory_seconds(roofline.prefill_bytes(n, cached)))
    fraction = seconds / duration if duration > 0 else 1.0
    return steps * weight_share + prefill * fraction


def price_late_interval(
    iv: EngineInterval,
    closed: list[ClosedSlice],
    until: float,
    dollars_per_gpu_second: float,
) -> float:
    """Charge a record that arrived after its node's slices closed for its part before
    ``until``: its modeled share of each closed slice it was active in (as if it had been
    there), or the full rate of its GPUs where its group was idle. Returns the dollars,
    which the other members of those slices have already been charged too."""
    charged = 0.0
    for piece in closed:
        if piece.end <= iv.prefill_start or piece.start >= min(until, iv.end):
            continue
        cuts = sorted({piece.start, piece.end, *(
            t for t in (iv.prefill_start, iv.decode_start, iv.end, until)
            if piece.start < t < piece.end)})
        dt = piece.end - piece.start
        for a, b in pairwise(cuts):
            mid = a + (b - a) / 2.0
            phase = iv.phase_at(mid)
            if phase is None or mid >= until:
                continue
            part = (b - a) / dt
            summary = piece.groups.get(iv.group)
            if summary is None:
                dollars = iv.gpus * dollars_per_gpu_second * (b - a)
            else:
                work = _late_work(iv, phase, summary, b - a, part, mid)
                total = summary.total_work * part
                dollars = summary.dollars * part * work / (total + work) if work > 0 else 0.0
                # the next late record of this slice competes with this one too
                summary.total_work += work / part
                summary.batch += 1
            iv.cost_by_phase[phase] = iv.cost_by_phase.get(phase, 0.0) + dollars
            charged += dollars
    return charged
