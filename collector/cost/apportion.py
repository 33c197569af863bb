"""Apportionment of a node's GPU time among the requests active on it (SPEC section 5).

The node timeline is cut at every request's engine events (scheduled, first token, done).
Between two cuts the set of active sequences is fixed, so the slice is a run of engine
steps with one batch composition. The slice's GPU dollars are split among the engine groups
active on the node by the GPUs they occupy (unoccupied GPUs are idle), and within a group
among its sequences by their roofline work in the slice:

- a decoding sequence does ``S`` steps of its own decode compute and KV read at its
  context (which grows linearly over its decode) plus a ``1/B`` share of the weights;
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

Linear time. Every member's work in a slice has the form ``S * (k + m * t + ws) + r * dt``
(``t`` the slice's midpoint, ``ws`` the weight share, ``k, m, r`` the member's own
coefficients in its phase), so a group's total work is read from running sums of the
coefficients, and a member's dollars over a phase from four prefix sums over the group's
slices (``D * S / W``, ``D * S * t / W``, ``D * S * ws / W``, ``D * dt / W``) taken when it
enters and leaves the phase. Closing a slice costs O(groups), admitting or finishing a
request O(log n) (the event heap): CPU per request does not grow with the batch.

Slices are cut only at engine events, never at the watermark while a request is active,
so the same records give the same dollars whichever collector prices them and whenever it
closes (the sharded pricing of docs/deploy.md relies on it).

Energy rides on the same shares. Each slice's joules are the node's measured GPU energy
over it (``meter``) when the agent reports one, else modeled (``modeled_joules_per_dollar``:
the GPU's TDP over its price). They are split between the busy and the idle GPU time of the
slice in proportion to their dollars, an idle GPU-second weighing ``IDLE_POWER_FRACTION``
of a busy one; the busy part follows the dollars, member by member, through four more
prefix sums (the dollar ones scaled by the slice's joules per weighted dollar). Busy plus
idle joules are the slice's joules, so per node they add up to the measured energy of the
window wherever it was measured.

Everything here is modeled (provenance ``modeled``); the inputs are measured timestamps
(and, for energy, the measured counter).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, fields
from itertools import pairwise

from tokenpath.collector.cost.energy import IDLE_POWER_FRACTION
from tokenpath.roofline import Roofline
from tokenpath.stage_members import DECODE, PREFILL
from tokenpath.stages import Phase

GroupKey = tuple[str, str, str, int]  # (engine, model, gpu type, tensor parallel)
IDLE_ROUNDING_FLOOR = 1e-12  # relative; below this a slice's leftover is float rounding
MIN_IN_MODEL_FRACTION = 0.5  # below this the engine's own in-model/elapsed is not trusted
DEFAULT_ENGINE_RETIRE_SECONDS = 600.0
# A decode shorter than this is priced at its midpoint context (a slope over a span near
# zero would be ill-conditioned; the context cannot change by more than its tokens).
DECODE_SLOPE_MIN_SECONDS = 1e-3
# Every this many slices a node's prefix sums and time origin are moved to the present,
# each active member banking its share so far: the sums stay short and well-conditioned
# however long the node runs.
REBASE_SLICES = 1024

# Running-sum slots of a group (and coefficient slots of a member)
_K, _M, _R, _DC0, _DC1, _DM0, _DM1, _PC, _PM, _PNV, _DECODERS, _RATIO, _RATIOS, _COUNT = range(14)
_SLOTS = 14
# Prefix-sum slots of a group: dollars (P1-P4), batch and decode seconds, joules (E1-E4)
# and slices whose joules were modeled or measured
_P1, _P2, _P3, _P4, _PB, _PD, _E1, _E2, _E3, _E4, _EMODELED, _EMEASURED = range(12)
_PREFIXES = 12
# measured GPU joules of the node between two times; None where the meter cannot say
EnergyMeter = Callable[[float, float], "float | None"]


@dataclass(slots=True, init=False)  # a written __init__: see tokenpath/records.py
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
    cost_by_phase: dict[Phase, float]
    energy_joules: float
    # slices of its life whose joules were modeled, and measured
    modeled_energy_slices: float
    measured_energy_slices: float
    late_dollars: float  # charged from closed slices (their joules are modeled)
    decode_batch_seconds: float  # integral of batch size over decode time
    decode_seconds_seen: float
    prefill_steps: float | None  # engine steps of its prefill, when measured
    # Its engine's in-model seconds over its elapsed seconds (None: the engine did not say)
    in_model_ratio: float | None
    # sweep state: the phase it is in, its coefficients there, the prefix sums at entry
    phase: Phase | None
    coefficients: list[float]
    entry: list[float]

    def __init__(self, key: int, group: GroupKey, roofline: Roofline | None,
                 prefill_start: float, decode_start: float, end: float, input_tokens: int,
                 cached_tokens: int, output_tokens: int, gpus: int,
                 prefill_steps: float | None = None,
                 in_model_ratio: float | None = None) -> None:
        """What a record says of its engine timeline; the rest is accumulated state."""
        self.key = key
        self.group = group
        self.roofline = roofline
        self.prefill_start = prefill_start
        self.decode_start = decode_start
        self.end = end
        self.input_tokens = input_tokens
        self.cached_tokens = cached_tokens
        self.output_tokens = output_tokens
        self.gpus = gpus
        self.cost_by_phase = {}
        self.energy_joules = 0.0
        self.modeled_energy_slices = 0.0
        self.measured_energy_slices = 0.0
        self.late_dollars = 0.0
        self.decode_batch_seconds = 0.0
        self.decode_seconds_seen = 0.0
        self.prefill_steps = prefill_steps
        self.in_model_ratio = in_model_ratio
        self.phase = None
        self.coefficients = []
        self.entry = []

    @property
    def new_tokens(self) -> int:
        return max(1, self.input_tokens - self.cached_tokens)

    def phase_at(self, t: float) -> Phase | None:
        if self.prefill_start <= t < self.decode_start:
            return PREFILL
        if self.decode_start <= t < self.end:
            return DECODE
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


@dataclass(slots=True, init=False)
class GroupSummary:
    """What one engine group did in a closed slice, kept to price late records."""

    total_work: float
    steps: float
    batch: int
    dollars: float

    def __init__(self, total_work: float, steps: float, batch: int, dollars: float) -> None:
        self.total_work = total_work
        self.steps = steps
        self.batch = batch
        self.dollars = dollars


@dataclass(slots=True, init=False)
class ClosedSlice:
    start: float
    end: float
    groups: dict[GroupKey, GroupSummary]

    def __init__(self, start: float, end: float,
                 groups: dict[GroupKey, GroupSummary] | None = None) -> None:
        self.start = start
        self.end = end
        self.groups = {} if groups is None else groups


@dataclass(slots=True, init=False)
class SliceResult:
    """What advancing a node's timeline produced (starts empty)."""

    node_dollars: float
    attributed_dollars: float
    idle_dollars: float
    attributed_joules: float
    idle_joules: float
    measured_joules: float  # the meter's joules over the slices it covered
    measured_seconds: float
    modeled_seconds: float  # slices priced without a meter reading
    # (start, end, dollars, joules) of each slice's unused GPU time
    idle_spans: list[tuple[float, float, float, float]]
    finished: list[EngineInterval]

    def __init__(self) -> None:
        self.node_dollars = 0.0
        self.attributed_dollars = 0.0
        self.idle_dollars = 0.0
        self.attributed_joules = 0.0
        self.idle_joules = 0.0
        self.measured_joules = 0.0
        self.measured_seconds = 0.0
        self.modeled_seconds = 0.0
        self.idle_spans = []
        self.finished = []

    def add(self, other: SliceResult) -> None:
        """Fold ``other`` (a later advance) into this result."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, list):
                mine.extend(theirs)
            else:
                setattr(self, f.name, mine + theirs)


def _coefficients(iv: EngineInterval, phase: Phase, origin: float) -> list[float]:
    """The member's coefficients in ``phase``: work ``S * (k + m * t + ws) + r * dt`` and
    its parts of the step-count solve (``t`` counted from ``origin``)."""
    c = [0.0] * _SLOTS
    c[_COUNT] = 1.0
    if iv.in_model_ratio is not None:
        c[_RATIO] = iv.in_model_ratio
        c[_RATIOS] = 1.0
    roofline = iv.roofline
    if roofline is None:
        c[_K] = 1.0  # equal split
        return c
    if phase is DECODE:
        # decode compute and KV read per step are affine in the context, which is affine
        # in time: read them at both ends of the decode
        t0, t1 = iv.decode_start - origin, iv.end - origin
        ctx0 = iv.context_at(iv.decode_start)
        ctx1 = iv.context_at(iv.end)
        if t1 - t0 < DECODE_SLOPE_MIN_SECONDS:
            ctx0 = ctx1 = iv.context_at((iv.decode_start + iv.end) / 2.0)
        c0 = roofline.compute_seconds(roofline.decode_flops(ctx0))
        m0 = roofline.memory_seconds(roofline.decode_bytes(ctx0))
        c1 = roofline.compute_seconds(roofline.decode_flops(ctx1))
        m1 = roofline.memory_seconds(roofline.decode_bytes(ctx1))
        span = t1 - t0
        c_slope = (c1 - c0) / span if span > 0 else 0.0
        m_slope = (m1 - m0) / span if span > 0 else 0.0
        c[_DC1], c[_DC0] = c_slope, c0 - c_slope * t0
        c[_DM1], c[_DM0] = m_slope, m0 - m_slope * t0
        c[_M] = c_slope + m_slope
        c[_K] = c[_DC0] + c[_DM0]
        c[_DECODERS] = 1.0
        return c
    n, cached = iv.new_tokens, iv.cached_tokens
    compute = roofline.compute_seconds(roofline.prefill_flops(n, cached))
    memory = roofline.memory_seconds(roofline.prefill_bytes(n, cached))
    if iv.prefill_steps is not None:
        # measured step count: each of its steps does 1/K of the prefill, like a decoder
        c[_DC0] = compute / iv.prefill_steps
        c[_DM0] = memory / iv.prefill_steps
        c[_K] = c[_DC0] + c[_DM0]
        return c
    duration = iv.decode_start - iv.prefill_start
    rate = 1.0 / duration if duration > 0 else 0.0
    c[_PC] = compute * rate
    c[_PM] = memory * rate
    c[_PNV] = roofline.nvlink_seconds(n) * rate  # linear in tokens
    c[_R] = (compute + memory) * rate
    return c


class _GroupSweep:
    """Running sums of one engine group's active members and its prefix sums."""

    __slots__ = ("gpus", "members", "prefix", "roofline", "sums")

    def __init__(self, roofline: Roofline | None, gpus: int) -> None:
        self.roofline = roofline
        self.gpus = gpus
        self.sums = [0.0] * _SLOTS
        self.prefix = [0.0] * _PREFIXES
        self.members: dict[int, EngineInterval] = {}

    @property
    def count(self) -> int:
        return len(self.members)

    def enter(self, iv: EngineInterval) -> None:
        self.members[iv.key] = iv
        sums = self.sums
        for i, v in enumerate(iv.coefficients):
            sums[i] += v

    def leave(self, iv: EngineInterval) -> None:
        del self.members[iv.key]
        if not self.members:  # empty: no drift carried into the next batch
            self.sums = [0.0] * _SLOTS
            self.prefix = [0.0] * _PREFIXES
            return
        sums = self.sums
        for i, v in enumerate(iv.coefficients):
            sums[i] -= v

    def rebase(self, shift: float) -> None:
        """Bank every member's share so far, move the time origin ``shift`` seconds
        forward, and start the sums afresh (exact, not drifted)."""
        sums = [0.0] * _SLOTS
        for iv in self.members.values():
            _bank(iv, self.prefix)
            c = iv.coefficients
            c[_K] += c[_M] * shift
            c[_DC0] += c[_DC1] * shift
            c[_DM0] += c[_DM1] * shift
            iv.entry = [0.0] * _PREFIXES
            for i, v in enumerate(c):
                sums[i] += v
        self.sums = sums
        self.prefix = [0.0] * _PREFIXES

    def in_model_fraction(self) -> float:
        sums = self.sums
        if sums[_RATIOS] < 0.5:
            return 1.0
        return min(1.0, max(MIN_IN_MODEL_FRACTION, sums[_RATIO] / sums[_RATIOS]))

    def close(self, dt: float, t: float, dollars: float, in_model_fraction: float,
              joules_per_dollar: float, modeled: bool) -> GroupSummary:
        """Add the slice ``dt`` long, midpoint ``t``, worth ``dollars`` (and
        ``joules_per_dollar`` of energy per dollar) to the prefix sums."""
        s = self.sums
        batch = self.count
        prefix = self.prefix
        roofline = self.roofline
        rho = joules_per_dollar
        prefix[_EMODELED if modeled else _EMEASURED] += 1.0
        if roofline is None:
            total, steps = float(batch), 1.0
            prefix[_P1] += dollars / total
            prefix[_E1] += rho * dollars / total
        else:
            weight_share = roofline.memory_seconds(roofline.model.weight_bytes / batch)
            steps = 1.0
            if s[_PC] > 0 or s[_PM] > 0:
                overhead = (roofline.step_overhead_seconds
                            + roofline.nvlink_seconds(round(s[_DECODERS])))
                weights = roofline.memory_seconds(roofline.model.weight_bytes)
                # step time in the slice; the prefill tokens' all-reduces lengthen the steps
                busy = dt * in_model_fraction - s[_PNV] * dt
                by_compute = (busy - s[_PC] * dt) / (overhead + s[_DC0] + s[_DC1] * t)
                by_memory = (busy - s[_PM] * dt) / (overhead + weights + s[_DM0] + s[_DM1] * t)
                steps = max(1.0, min(by_compute, by_memory))
            total = steps * (s[_K] + s[_M] * t + batch * weight_share) + s[_R] * dt
            if total > 0:
                q = dollars / total
                prefix[_P1] += q * steps
                prefix[_P2] += q * steps * t
                prefix[_P3] += q * steps * weight_share
                prefix[_P4] += q * dt
                q *= rho
                prefix[_E1] += q * steps
                prefix[_E2] += q * steps * t
                prefix[_E3] += q * steps * weight_share
                prefix[_E4] += q * dt
        prefix[_PB] += batch * dt
        prefix[_PD] += dt
        return GroupSummary(total, steps, batch, dollars)


def _share(iv: EngineInterval, prefix: list[float], first: int = _P1) -> float:
    """The member's dollars (``first`` = ``_E1``: joules) since it entered its phase (or
    since the last rebase)."""
    entry, c = iv.entry, iv.coefficients
    p1, p2, p3, p4 = first, first + 1, first + 2, first + 3
    return (c[_K] * (prefix[p1] - entry[p1]) + c[_M] * (prefix[p2] - entry[p2])
            + (prefix[p3] - entry[p3]) + c[_R] * (prefix[p4] - entry[p4]))


def _bank(iv: EngineInterval, prefix: list[float]) -> None:
    """Add what ``iv`` accrued since its entry snapshot to its totals."""
    assert iv.phase is not None
    iv.cost_by_phase[iv.phase] = (iv.cost_by_phase.get(iv.phase, 0.0)
                                  + max(0.0, _share(iv, prefix)))
    iv.energy_joules += max(0.0, _share(iv, prefix, _E1))
    iv.modeled_energy_slices += prefix[_EMODELED] - iv.entry[_EMODELED]
    iv.measured_energy_slices += prefix[_EMEASURED] - iv.entry[_EMEASURED]
    if iv.phase is DECODE:
        iv.decode_batch_seconds += prefix[_PB] - iv.entry[_PB]
        iv.decode_seconds_seen += prefix[_PD] - iv.entry[_PD]


class NodeTimeline:
    """One node's timeline: an event sweep over its requests' engine intervals.

    ``add()`` an interval (its events enter the heap), ``advance(stop)`` closes every slice
    that ends by ``stop``: up to the next event while a request is active, up to ``stop``
    while the node is idle. Intervals whose last phase closed come back in
    ``SliceResult.finished`` with their ``cost_by_phase``.
    """

    def __init__(self, dollars_per_gpu_second: float, gpu_count: int | None,
                 max_closed_slices: int, late_horizon_seconds: float,
                 engine_retire_seconds: float = DEFAULT_ENGINE_RETIRE_SECONDS,
                 modeled_joules_per_dollar: float = 0.0,
                 meter: EnergyMeter | None = None) -> None:
        self.dollars_per_gpu_second = dollars_per_gpu_second
        self.modeled_joules_per_dollar = modeled_joules_per_dollar
        self.meter = meter
        self.fixed_gpu_count = gpu_count  # from the inventory; None: its engines' GPUs
        self.groups: dict[GroupKey, _GroupSweep] = {}
        # per engine (its id; "" when unnamed): its GPUs (the largest TP seen) and the
        # last end of its requests. Its models' groups share those GPUs; without an
        # inventory entry an engine counts towards the node's GPUs until it has served
        # nothing for engine_retire_seconds (a restarted pod, a process gone).
        self.engines: dict[str, list[float]] = {}
        self._retire = engine_retire_seconds
        self._active: dict[GroupKey, _GroupSweep] = {}
        self._events: list[tuple[float, int, EngineInterval, Phase | None]] = []
        self._sequence = 0
        self.window_start: float | None = None
        self.closed_until: float | None = None
        self.closed: deque[ClosedSlice] = deque(maxlen=max_closed_slices)
        self._late_horizon = late_horizon_seconds
        self._origin = 0.0  # times in the sums count from here (moved by _rebase)
        self._slices_since_rebase = 0

    @property
    def gpu_count(self) -> int:
        """The node's GPUs now (at the last closed slice)."""
        return self.gpus_at(self.closed_until)

    def gpus_at(self, t: float | None) -> int:
        if self.fixed_gpu_count is not None:
            return self.fixed_gpu_count
        if t is None:
            return max(1, round(sum(e[0] for e in self.engines.values())))
        return round(sum(gpus for gpus, last_end in self.engines.values()
                         if last_end > t - self._retire))

    @property
    def retired(self) -> bool:
        """No engine of this unit has served anything for the retire time."""
        return self.fixed_gpu_count is None and not self._active and not self._events and (
            self.gpus_at(self.closed_until) == 0)

    def closed_after(self, t: float) -> list[ClosedSlice]:
        """The kept closed slices that end after ``t``, in time order: all a late record
        that started at ``t`` can be priced from (walked from the newest, so a record
        that missed its window by seconds does not walk the whole horizon)."""
        out: list[ClosedSlice] = []
        for piece in reversed(self.closed):
            if piece.end <= t:
                break
            out.append(piece)
        out.reverse()
        return out

    def add(self, iv: EngineInterval) -> bool:
        """Schedule ``iv``; False when all of it lies in slices already closed (the caller
        prices it from the closed slices and it needs nothing more here)."""
        if iv.group not in self.groups:
            self.groups[iv.group] = _GroupSweep(iv.roofline, iv.gpus)
        engine = self.engines.setdefault(iv.group[0], [0.0, iv.end])
        engine[0] = max(engine[0], float(iv.gpus))
        engine[1] = max(engine[1], iv.end)
        closed = self.closed_until
        if closed is None or iv.prefill_start >= closed:
            self._push(iv.prefill_start, iv, PREFILL)
            return True
        # late: its part before ``closed`` is priced elsewhere; join at ``closed``
        if iv.end <= closed:
            return False
        self._push(closed, iv, DECODE if iv.decode_start <= closed else PREFILL)
        return True

    def _push(self, t: float, iv: EngineInterval, phase: Phase | None) -> None:
        self._sequence += 1
        heapq.heappush(self._events, (t, self._sequence, iv, phase))

    def _transition(self, iv: EngineInterval, phase: Phase | None, t: float,
                    finished: list[EngineInterval]) -> None:
        """``iv`` leaves its phase (if any) and enters ``phase`` (None: it is done)."""
        if iv.phase is not None:
            group = self.groups[iv.group]
            _bank(iv, group.prefix)
            group.leave(iv)
            if group.count == 0:
                self._active.pop(iv.group, None)
        iv.phase = phase
        if phase is None:
            finished.append(iv)
            return
        group = self.groups[iv.group]
        iv.coefficients = _coefficients(iv, phase, self._origin)
        iv.entry = list(group.prefix)
        group.enter(iv)
        self._active[iv.group] = group
        if phase is PREFILL:
            self._push(max(t, iv.decode_start), iv, DECODE)
        else:
            self._push(max(t, iv.end), iv, None)

    def flush(self) -> SliceResult:
        """Close every slice up to the last event: every interval finishes."""
        total = SliceResult()
        while self._events:
            total.add(self.advance(max(e[0] for e in self._events)))
        return total

    def advance(self, stop: float) -> SliceResult:
        """Close every slice ending by ``stop``."""
        result = SliceResult()
        events = self._events
        while True:
            if self.closed_until is None:
                if not events or events[0][0] > stop:
                    break
                self.closed_until = self.window_start = self._origin = events[0][0]
            cur = self.closed_until
            if events and events[0][0] <= stop:
                t = events[0][0]
                if t > cur:
                    self._close_slice(cur, t, result)
                    self.closed_until = t
                while events and events[0][0] <= t:
                    _, _, iv, phase = heapq.heappop(events)
                    self._transition(iv, phase, t, result.finished)
                continue
            if not self._active and stop > cur:
                # idle: no request cuts it, only an engine retiring (its GPUs stop counting)
                cuts = sorted({end + self._retire for _, end in self.engines.values()
                               if cur < end + self._retire < stop} | {stop})
                for cut in cuts:
                    self._close_slice(self.closed_until, cut, result)
                    self.closed_until = cut
            break
        return result

    def _close_slice(self, a: float, b: float, result: SliceResult) -> None:
        dt = b - a
        price = self.dollars_per_gpu_second
        piece = ClosedSlice(a, b)
        used = 0.0
        node_gpus = self.gpus_at(a)
        parts: list[tuple[GroupKey, _GroupSweep, float, float]] = []
        if self._active:
            # the engines busy in the slice and how many of their groups (models) are
            members: dict[str, int] = {}
            for key, group in self._active.items():
                members[key[0]] = members.get(key[0], 0) + group.count
            demand = sum(self.engines[e][0] for e in members)
            node_gpus = max(node_gpus, round(demand)) if self.fixed_gpu_count is None \
                else node_gpus
            scale = min(1.0, node_gpus / demand)
            for key, group in self._active.items():
                fraction = group.in_model_fraction()
                # an engine's GPUs, shared by its models' groups by their requests
                share = group.count / members[key[0]]
                dollars = price * self.engines[key[0]][0] * share * scale * dt * fraction
                parts.append((key, group, dollars, fraction))
                used += dollars
        node_dollars = node_gpus * price * dt
        idle = node_dollars - used
        if idle <= node_dollars * IDLE_ROUNDING_FLOOR:
            idle = 0.0
        rho, modeled = self._joules_per_dollar(a, b, used + IDLE_POWER_FRACTION * idle, result)
        t = (a + b) / 2.0 - self._origin
        for key, group, dollars, fraction in parts:
            piece.groups[key] = group.close(dt, t, dollars, fraction, rho, modeled)
        result.node_dollars += node_dollars
        result.attributed_dollars += used
        result.attributed_joules += used * rho
        if idle > 0:
            idle_joules = idle * IDLE_POWER_FRACTION * rho
            result.idle_dollars += idle
            result.idle_joules += idle_joules
            result.idle_spans.append((a, b, idle, idle_joules))
        self.closed.append(piece)
        horizon = b - self._late_horizon
        while self.closed and self.closed[0].end < horizon:
            self.closed.popleft()
        self._slices_since_rebase += 1
        if self._slices_since_rebase >= REBASE_SLICES or not self._active:
            self._rebase(b)

    def _joules_per_dollar(self, a: float, b: float, weighted_dollars: float,
                           result: SliceResult) -> tuple[float, bool]:
        """Joules per (idle-weighted) dollar of the slice ``[a, b]`` and whether they were
        modeled: the meter's joules over the slice where it covers it, else the modeled
        rate (TDP over price)."""
        joules = None if self.meter is None or b <= a else self.meter(a, b)
        if joules is not None and weighted_dollars > 0:
            result.measured_joules += joules
            result.measured_seconds += b - a
            return joules / weighted_dollars, False
        result.modeled_seconds += b - a
        return self.modeled_joules_per_dollar, True

    def _rebase(self, t: float) -> None:
        shift = t - self._origin
        for group in self._active.values():
            group.rebase(shift)
        self._origin = t
        self._slices_since_rebase = 0


def _late_work(iv: EngineInterval, phase: Phase, summary: GroupSummary, seconds: float,
               part: float, mid: float) -> float:
    """The late interval's work in ``part`` (a fraction, ``seconds`` long) of a closed slice."""
    roofline = iv.roofline
    if roofline is None:
        return part
    weight_share = roofline.memory_seconds(roofline.model.weight_bytes / (summary.batch + 1))
    steps = summary.steps * part
    if phase is DECODE:
        ctx = iv.context_at(mid)
        return steps * (roofline.compute_seconds(roofline.decode_flops(ctx))
                        + roofline.memory_seconds(roofline.decode_bytes(ctx))
                        + weight_share)
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
    there), or the full rate of its GPUs where its group was idle. ``closed``: the kept
    closed slices in time order, at least those ending after its start
    (:meth:`NodeTimeline.closed_after`). Returns the dollars, which the other members of
    those slices have already been charged too."""
    charged = 0.0
    stop = min(until, iv.end)
    # before the oldest slice still kept: its GPUs' full rate, phase by phase
    oldest = closed[0].start if closed else stop
    for early_phase, a, b in ((PREFILL, iv.prefill_start, iv.decode_start),
                              (DECODE, iv.decode_start, iv.end)):
        seconds = max(0.0, min(b, oldest, stop) - a)
        if seconds > 0:
            dollars = iv.gpus * dollars_per_gpu_second * seconds
            iv.cost_by_phase[early_phase] = iv.cost_by_phase.get(early_phase, 0.0) + dollars
            charged += dollars
    for piece in closed:
        if piece.end <= iv.prefill_start or piece.start >= stop:
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


def is_finite_interval(prefill_start: float, decode_start: float, end: float) -> bool:
    return all(math.isfinite(v) for v in (prefill_start, decode_start, end)) and (
        prefill_start <= decode_start <= end)
