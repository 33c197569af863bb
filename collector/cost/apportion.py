"""Apportionment of a node's GPU time among the requests active on it (docs/cost-model.md).

The node timeline is cut at every request's engine events (scheduled, first token, done).
Between two cuts the set of active sequences is fixed. Each such node slice's GPU dollars
go to the engines busy in it (an engine's GPUs; unoccupied GPUs are idle), and an
engine's dollars to the groups (models) it serves by their requests, each scaled by its
in-model fraction. Within a group, dollars are split among its sequences by their
roofline work over the group's own slices: the runs of time between two events of the
group's own members, over which its batch composition is fixed (a run of engine steps
with one batch). Other groups' events change how many dollars the group gets, not how
its members share them:

- a decoding sequence does ``S`` steps of its own decode compute and KV read at its
  context (which grows linearly over its decode) plus a ``1/B`` share of the weights;
- a prefilling sequence whose step count ``K`` the engine measured (chunked prefill; from
  its per-phase gpu_dispatch) does ``S`` steps of ``1/K`` of its prefill FLOPs and KV bytes
  plus a weight share; otherwise the fraction ``dt / prefill_duration`` of them, plus ``S``
  weight shares;
- ``S`` (steps in the group slice) is solved from the roofline step time when a prefill is
  in it: ``f * dt = Nv + S * (overhead + nv_d) + max(Pc + S * Cd, Pm + S * (W + Md))``
  (``Pc, Pm, Nv``: the prefill compute, memory and all-reduce seconds placed in the slice
  by time fraction; ``Cd, Md, nv_d``: one step's decode compute, memory and all-reduce
  seconds; ``W``: streaming the weights). The max of two increasing lines reaches
  ``f * dt`` at the smaller of their two solutions; at least one step. Without a prefill
  ``S`` cancels out.

Linear time, whatever the number of groups. A group's dollars over one of its slices are
its weight (requests x in-model fraction, fixed over the slice) times the growth of its
engine's running sum ``q`` (each node slice adds the engine's dollars per request in it),
so a node slice costs O(busy engines) and a group is visited only at its own events
(settled: its slice's dollars read from ``q`` and split). Every member's work in a group
slice has the form ``S * (k + m * t + ws) + r * dt`` (``t`` the slice's midpoint, ``ws``
the weight share, ``k, m, r`` the member's own coefficients in its phase), so a group's
total work is read from running sums of the coefficients, and a member's dollars over a
phase from four prefix sums over the group's slices (``D * S / W``, ``D * S * t / W``,
``D * S * ws / W``, ``D * dt / W``) taken when it enters and leaves the phase. Each event
costs O(log n) (the event heap) and one group settle: CPU per request grows neither with
the batch nor with the number of models on the node.

Slices are cut only at engine events, never at the watermark while a request is active,
so the same records give the same dollars whichever collector prices them and whenever it
closes (the sharded pricing of docs/deploy.md relies on it). ``advance`` takes a budget
(slices closed plus events taken), so a large close runs as bounded steps.

Energy rides on the same shares. Each slice's joules are the node's measured GPU energy
over it (``meter``) when the agent reports one, else modeled (``modeled_joules_per_dollar``:
the GPU's TDP over its price). They are split between the busy and the idle GPU time of the
slice in proportion to their dollars, an idle GPU-second weighing ``IDLE_POWER_FRACTION``
of a busy one; the busy part follows the dollars (each engine's ``qe`` beside its ``q``,
and four more prefix sums per group). Busy plus idle joules are the slice's joules, so per
node they add up to the measured energy of the window wherever it was measured.

Late records (one that arrives after its node's slices closed) are charged from the idle
of the closed slices they overlap (:func:`price_late_interval`), from a summary kept per
closed slice and per busy engine, never per group.

Everything here is modeled (provenance ``modeled``); the inputs are measured timestamps
(and, for energy, the measured counter).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
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
# Every this many of a group's slices its prefix sums and time origin are moved to the
# present, each active member banking its share so far; an engine's running sums are
# moved to zero every this many node slices (or four per active group, whichever is more:
# each move visits its active groups). The sums stay short and well-conditioned however
# long the node runs.
REBASE_SLICES = 1024
UNBOUNDED = -1  # ``advance``'s budget: no bound

# Running-sum slots of a group (and coefficient slots of a member)
_K, _M, _R, _DC0, _DC1, _DM0, _DM1, _PC, _PM, _PNV, _DECODERS, _RATIO, _RATIOS, _COUNT = range(14)
_SLOTS = 14
# Prefix-sum slots of a group: dollars (P1-P4), batch and decode seconds, joules (E1-E4)
_P1, _P2, _P3, _P4, _PB, _PD, _E1, _E2, _E3, _E4 = range(10)
_PREFIXES = 10
# A member's entry snapshot: its group's prefix sums, then the node's count of slices
# whose joules were modeled and measured
_EMODELED, _EMEASURED = 10, 11
_ENTRY = 12
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
    late_dollars: float  # charged from the idle of closed slices (their joules modeled)
    late_unpriced_dollars: float  # what that idle could not cover: not charged
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
        self.late_unpriced_dollars = 0.0
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
class ClosedSlice:
    """What a closed node slice keeps to charge late records: the idle dollars left in it
    (and the idle joules per idle dollar), and per busy engine ``[its GPUs' dollars per
    second, its requests]`` (requests counting the late records charged there since)."""

    start: float
    end: float
    idle: float
    idle_joules_per_dollar: float
    engines: dict[str, list[float]]

    def __init__(self, start: float, end: float, idle: float = 0.0,
                 idle_joules_per_dollar: float = 0.0,
                 engines: dict[str, list[float]] | None = None) -> None:
        self.start = start
        self.end = end
        self.idle = idle
        self.idle_joules_per_dollar = idle_joules_per_dollar
        self.engines = {} if engines is None else engines


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
    slices: int  # slices closed
    work: int  # slices closed plus events taken (what a budget counts)
    done: bool  # nothing more to close up to the stop asked for

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
        self.slices = 0
        self.work = 0
        self.done = True

    def add(self, other: SliceResult) -> None:
        """Fold ``other`` (a later advance) into this result."""
        self.node_dollars += other.node_dollars
        self.attributed_dollars += other.attributed_dollars
        self.idle_dollars += other.idle_dollars
        self.attributed_joules += other.attributed_joules
        self.idle_joules += other.idle_joules
        self.measured_joules += other.measured_joules
        self.measured_seconds += other.measured_seconds
        self.modeled_seconds += other.modeled_seconds
        self.idle_spans.extend(other.idle_spans)
        self.finished.extend(other.finished)
        self.slices += other.slices
        self.work += other.work
        self.done = other.done


@dataclass(slots=True, init=False)
class LateCharge:
    """What pricing a late record took from the closed slices: the dollars charged (from
    their idle), the dollars that idle could not cover (unpriced), and the idle it took
    as ``(start, end, -dollars, -joules)`` spans (negative idle rows)."""

    charged: float
    unpriced: float
    idle_spans: list[tuple[float, float, float, float]]

    def __init__(self) -> None:
        self.charged = 0.0
        self.unpriced = 0.0
        self.idle_spans = []


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


class _EngineSweep:
    """One engine's busy state: its active groups, its requests and their weight (the
    sum of requests x in-model fraction over its groups), and its running sums ``q`` (its
    dollars per request, slice by slice) and ``qe`` (the same in joules)."""

    __slots__ = ("active", "members", "q", "qe", "rate", "slices", "weight")

    def __init__(self) -> None:
        self.active: dict[GroupKey, _GroupSweep] = {}
        self.members = 0
        self.weight = 0.0
        self.q = 0.0
        self.qe = 0.0
        self.rate = 0.0  # the slice being closed: its dollars per request
        self.slices = 0  # node slices since ``q`` was last moved to zero

    def rebase(self) -> None:
        """Move ``q`` and ``qe`` to zero, keeping what each active group has pending."""
        q, qe = self.q, self.qe
        for group in self.active.values():
            group.snap_q -= q
            group.snap_qe -= qe
        self.q = 0.0
        self.qe = 0.0
        self.slices = 0

    def empty(self) -> None:
        """No request left: start the sums afresh (no drift carried)."""
        self.members = 0
        self.weight = 0.0
        self.q = 0.0
        self.qe = 0.0
        self.slices = 0


class _GroupSweep:
    """Running sums of one engine group's active members, its prefix sums, and where its
    current slice began (``since``, and its engine's ``q`` and ``qe`` then)."""

    __slots__ = ("engine", "fraction", "gpus", "members", "origin", "prefix", "roofline",
                 "settles", "since", "snap_q", "snap_qe", "sums", "weight")

    def __init__(self, engine: _EngineSweep, roofline: Roofline | None, gpus: int) -> None:
        self.engine = engine
        self.roofline = roofline
        self.gpus = gpus
        self.sums = [0.0] * _SLOTS
        self.prefix = [0.0] * _PREFIXES
        self.members: dict[int, EngineInterval] = {}
        self.origin = 0.0  # times in its sums count from here
        self.since = 0.0
        self.snap_q = 0.0
        self.snap_qe = 0.0
        self.settles = 0  # its slices since its last rebase
        self.fraction = 1.0  # its in-model fraction
        self.weight = 0.0  # its requests x its in-model fraction, as its engine counts it

    @property
    def count(self) -> int:
        return len(self.members)

    def begin(self, t: float) -> None:
        """Its first member enters at ``t``: its sums start there."""
        self.origin = t
        self.since = t
        self.snap_q = self.engine.q
        self.snap_qe = self.engine.qe
        self.settles = 0

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

    def in_model_fraction(self) -> float:
        sums = self.sums
        if sums[_RATIOS] < 0.5:
            return 1.0
        return min(1.0, max(MIN_IN_MODEL_FRACTION, sums[_RATIO] / sums[_RATIOS]))

    def settle(self, t: float) -> None:
        """Close its slice ``[since, t]`` (its composition was fixed over it): its
        dollars and joules are its weight times its engine's growth in ``q`` and ``qe``,
        split among its members by their work."""
        engine = self.engine
        dt = t - self.since
        if dt > 0.0 and self.members:
            self._split(dt, (self.since + t) / 2.0 - self.origin,
                        self.weight * (engine.q - self.snap_q),
                        self.weight * (engine.qe - self.snap_qe))
            self.settles += 1
        self.since = t
        self.snap_q = engine.q
        self.snap_qe = engine.qe

    def _split(self, dt: float, t: float, dollars: float, joules: float) -> None:
        """Add its slice ``dt`` long, midpoint ``t``, worth ``dollars`` and ``joules``, to
        the prefix sums."""
        s = self.sums
        batch = self.count
        prefix = self.prefix
        roofline = self.roofline
        if roofline is None:
            prefix[_P1] += dollars / batch
            prefix[_E1] += joules / batch
        else:
            weight_share = roofline.memory_seconds(roofline.model.weight_bytes / batch)
            steps = 1.0
            if s[_PC] > 0 or s[_PM] > 0:
                overhead = (roofline.step_overhead_seconds
                            + roofline.nvlink_seconds(round(s[_DECODERS])))
                weights = roofline.memory_seconds(roofline.model.weight_bytes)
                # step time in the slice; the prefill tokens' all-reduces lengthen the steps
                busy = dt * self.fraction - s[_PNV] * dt
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
                q = joules / total
                prefix[_E1] += q * steps
                prefix[_E2] += q * steps * t
                prefix[_E3] += q * steps * weight_share
                prefix[_E4] += q * dt
        prefix[_PB] += batch * dt
        prefix[_PD] += dt

    def rebase(self, t: float) -> None:
        """Right after a settle at ``t``: bank every member's share so far, move the time
        origin to ``t``, and start the sums afresh (exact, not drifted)."""
        shift = t - self.origin
        sums = [0.0] * _SLOTS
        prefix = self.prefix
        for iv in self.members.values():
            _bank(iv, prefix)
            c = iv.coefficients
            c[_K] += c[_M] * shift
            c[_DC0] += c[_DC1] * shift
            c[_DM0] += c[_DM1] * shift
            entry = iv.entry
            for i in range(_PREFIXES):
                entry[i] = 0.0
            for i, v in enumerate(c):
                sums[i] += v
        self.sums = sums
        self.prefix = [0.0] * _PREFIXES
        self.origin = t
        self.settles = 0


def _share(iv: EngineInterval, prefix: list[float], first: int = _P1) -> float:
    """The member's dollars (``first`` = ``_E1``: joules) since it entered its phase (or
    since its group's last rebase)."""
    entry, c = iv.entry, iv.coefficients
    p1, p2, p3, p4 = first, first + 1, first + 2, first + 3
    return (c[_K] * (prefix[p1] - entry[p1]) + c[_M] * (prefix[p2] - entry[p2])
            + (prefix[p3] - entry[p3]) + c[_R] * (prefix[p4] - entry[p4]))


def _bank(iv: EngineInterval, prefix: list[float]) -> None:
    """Add what ``iv`` accrued from its group's prefix sums since its entry snapshot to
    its totals."""
    assert iv.phase is not None
    iv.cost_by_phase[iv.phase] = (iv.cost_by_phase.get(iv.phase, 0.0)
                                  + max(0.0, _share(iv, prefix)))
    iv.energy_joules += max(0.0, _share(iv, prefix, _E1))
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
        self._sweeps: dict[str, _EngineSweep] = {}
        self._busy: dict[str, _EngineSweep] = {}  # the engines with a request active
        self._retire = engine_retire_seconds
        self._events: list[tuple[float, int, EngineInterval, Phase | None]] = []
        self._sequence = 0
        self._flush_stop: float | None = None
        # slices whose joules were modeled, and measured (members read the difference)
        self._modeled_slices = 0.0
        self._measured_slices = 0.0
        self.window_start: float | None = None
        self.closed_until: float | None = None
        self.closed: deque[ClosedSlice] = deque(maxlen=max_closed_slices)
        self._late_horizon = late_horizon_seconds

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
        return self.fixed_gpu_count is None and not self._busy and not self._events and (
            self.gpus_at(self.closed_until) == 0)

    @property
    def active_groups(self) -> int:
        return sum(len(sweep.active) for sweep in self._busy.values())

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
            sweep = self._sweeps.get(iv.group[0])
            if sweep is None:
                sweep = self._sweeps[iv.group[0]] = _EngineSweep()
            self.groups[iv.group] = _GroupSweep(sweep, iv.roofline, iv.gpus)
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

    def _reweigh(self, group: _GroupSweep, key: GroupKey) -> None:
        """After ``group`` changed: its fraction and weight, and its engine's."""
        engine = group.engine
        if not group.members:
            engine.weight -= group.weight
            group.weight = 0.0
            group.fraction = 1.0
            engine.active.pop(key, None)
            if not engine.active:
                engine.empty()
                self._busy.pop(key[0], None)
            return
        group.fraction = group.in_model_fraction()
        weight = group.count * group.fraction
        engine.weight += weight - group.weight
        group.weight = weight
        engine.active[key] = group
        self._busy[key[0]] = engine

    def _transition(self, iv: EngineInterval, phase: Phase | None, t: float,
                    finished: list[EngineInterval]) -> None:
        """``iv`` leaves its phase (if any) and enters ``phase`` (None: it is done)."""
        key = iv.group
        group = self.groups[key]
        if iv.phase is not None:
            group.settle(t)
            if group.settles >= REBASE_SLICES:
                group.rebase(t)
            _bank(iv, group.prefix)
            iv.modeled_energy_slices += self._modeled_slices - iv.entry[_EMODELED]
            iv.measured_energy_slices += self._measured_slices - iv.entry[_EMEASURED]
            group.leave(iv)
            group.engine.members -= 1
            self._reweigh(group, key)
        iv.phase = phase
        if phase is None:
            finished.append(iv)
            return
        if group.members:
            group.settle(t)
            if group.settles >= REBASE_SLICES:
                group.rebase(t)
        else:
            group.begin(t)
        iv.coefficients = _coefficients(iv, phase, group.origin)
        entry = [0.0] * _ENTRY
        prefix = group.prefix
        for i in range(_PREFIXES):
            entry[i] = prefix[i]
        entry[_EMODELED] = self._modeled_slices
        entry[_EMEASURED] = self._measured_slices
        iv.entry = entry
        group.enter(iv)
        group.engine.members += 1
        self._reweigh(group, key)
        if phase is PREFILL:
            self._push(max(t, iv.decode_start), iv, DECODE)
        else:
            self._push(max(t, iv.end), iv, None)

    def flush(self, budget: int = UNBOUNDED) -> SliceResult:
        """Close every slice up to the last event: every interval finishes (within
        ``budget``, slices closed plus events taken; ``done`` says whether all did)."""
        total = SliceResult()
        events = self._events
        while events:
            left = UNBOUNDED if budget < 0 else budget - total.work
            if left == 0:
                total.done = False
                return total
            # the last event (found again only when a transition pushed one past it)
            if self._flush_stop is None or events[0][0] > self._flush_stop:
                self._flush_stop = max(e[0] for e in events)
            total.add(self.advance(self._flush_stop, left))
        self._flush_stop = None
        total.done = True
        return total

    def advance(self, stop: float, budget: int = UNBOUNDED) -> SliceResult:
        """Close every slice ending by ``stop``, at most ``budget`` slices closed plus
        events taken (``UNBOUNDED``: all); ``done`` says whether it got to ``stop``. The
        rest is closed by the next call, to the same slices."""
        result = SliceResult()
        events = self._events
        work = 0
        done = False
        while budget < 0 or work < budget:
            if self.closed_until is None:
                if not events or events[0][0] > stop:
                    done = True
                    break
                self.closed_until = self.window_start = events[0][0]
            cur = self.closed_until
            if events and events[0][0] <= stop:
                t = events[0][0]
                if t > cur:
                    self._close_slice(cur, t, result)
                    self.closed_until = t
                    work += 1
                while events and events[0][0] <= t and (budget < 0 or work < budget):
                    _, _, iv, phase = heapq.heappop(events)
                    self._transition(iv, phase, t, result.finished)
                    work += 1
                continue
            if not self._busy and stop > cur:
                # idle: no request cuts it, only an engine retiring (its GPUs stop counting)
                cuts = sorted({end + self._retire for _, end in self.engines.values()
                               if cur < end + self._retire < stop} | {stop})
                for cut in cuts:
                    if 0 <= budget <= work:
                        break
                    self._close_slice(self.closed_until, cut, result)
                    self.closed_until = cut
                    work += 1
                else:
                    done = True
                break
            done = True
            break
        result.work = work
        result.done = done
        return result

    def _close_slice(self, a: float, b: float, result: SliceResult) -> None:
        dt = b - a
        price = self.dollars_per_gpu_second
        piece = ClosedSlice(a, b)
        used = 0.0
        node_gpus = self.gpus_at(a)
        busy = self._busy
        if busy:
            engines = self.engines
            demand = 0.0
            for name in busy:
                demand += engines[name][0]
            if self.fixed_gpu_count is None:
                node_gpus = max(node_gpus, round(demand))
            scale = min(1.0, node_gpus / demand)
            summary = piece.engines
            for name, sweep in busy.items():
                # an engine's GPUs, shared by its models' groups by their requests
                rate = price * engines[name][0] * scale
                sweep.rate = rate * dt / sweep.members
                used += sweep.rate * sweep.weight
                summary[name] = [rate, float(sweep.members)]
        node_dollars = node_gpus * price * dt
        idle = node_dollars - used
        if idle <= node_dollars * IDLE_ROUNDING_FLOOR:
            idle = 0.0
        rho, modeled = self._joules_per_dollar(a, b, used + IDLE_POWER_FRACTION * idle, result)
        if modeled:
            self._modeled_slices += 1.0
        else:
            self._measured_slices += 1.0
        for sweep in busy.values():
            sweep.q += sweep.rate
            sweep.qe += sweep.rate * rho
            sweep.slices += 1
            if sweep.slices >= REBASE_SLICES and sweep.slices >= 4 * len(sweep.active):
                sweep.rebase()
        result.node_dollars += node_dollars
        result.attributed_dollars += used
        result.attributed_joules += used * rho
        result.slices += 1
        piece.idle_joules_per_dollar = IDLE_POWER_FRACTION * rho
        if idle > 0:
            idle_joules = idle * IDLE_POWER_FRACTION * rho
            result.idle_dollars += idle
            result.idle_joules += idle_joules
            result.idle_spans.append((a, b, idle, idle_joules))
            piece.idle = idle
        self.closed.append(piece)
        horizon = b - self._late_horizon
        while self.closed and self.closed[0].end < horizon:
            self.closed.popleft()

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


def price_late_interval(
    iv: EngineInterval,
    closed: list[ClosedSlice],
    until: float,
    dollars_per_gpu_second: float,
) -> LateCharge:
    """Charge a record that arrived after its node's slices closed for its part before
    ``until``, from the idle of the closed slices it overlaps. In each, it asks what it
    would have paid as one more request of its engine (the engine's GPUs' dollars over its
    time there, shared by the engine's requests and it; its own GPUs' full rate where its
    engine served nothing) and is charged that, up to the idle left in the slice (taken
    off it). What the idle cannot cover, and its part before the oldest slice still kept
    (whose idle is no longer known), is unpriced: counted, never charged. So the slices'
    attributed plus idle dollars stay their node dollars. ``closed``: the kept closed
    slices in time order, at least those ending after its start
    (:meth:`NodeTimeline.closed_after`)."""
    charge = LateCharge()
    stop = min(until, iv.end)
    price = dollars_per_gpu_second
    engine = iv.group[0]
    # before the oldest slice still kept: its GPUs' full rate, unpriced
    oldest = closed[0].start if closed else stop
    early = max(0.0, min(oldest, stop) - iv.prefill_start)
    charge.unpriced += iv.gpus * price * early
    for piece in closed:
        if piece.end <= iv.prefill_start or piece.start >= stop:
            continue
        cuts = sorted({piece.start, piece.end, *(
            t for t in (iv.prefill_start, iv.decode_start, iv.end, until)
            if piece.start < t < piece.end)})
        summary = piece.engines.get(engine)
        want_prefill = want_decode = 0.0
        for a, b in pairwise(cuts):
            mid = a + (b - a) / 2.0
            phase = iv.phase_at(mid)
            if phase is None or mid >= until:
                continue
            if summary is None:
                want = iv.gpus * price * (b - a)
            else:
                want = summary[0] * (b - a) / (summary[1] + 1.0)
            if phase is PREFILL:
                want_prefill += want
            else:
                want_decode += want
        want = want_prefill + want_decode
        if want <= 0.0:
            continue
        take = min(want, piece.idle)
        charge.unpriced += want - take
        # the next late record of this slice shares its engine with this one too
        if summary is None:
            piece.engines[engine] = [iv.gpus * price, 1.0]
        else:
            summary[1] += 1.0
        if take <= 0.0:
            continue
        piece.idle -= take
        part = take / want
        if want_prefill > 0.0:
            iv.cost_by_phase[PREFILL] = iv.cost_by_phase.get(PREFILL, 0.0) + want_prefill * part
        if want_decode > 0.0:
            iv.cost_by_phase[DECODE] = iv.cost_by_phase.get(DECODE, 0.0) + want_decode * part
        charge.charged += take
        charge.idle_spans.append((piece.start, piece.end, -take,
                                  -take * piece.idle_joules_per_dollar))
    return charge


def is_finite_interval(prefill_start: float, decode_start: float, end: float) -> bool:
    return all(math.isfinite(v) for v in (prefill_start, decode_start, end)) and (
        prefill_start <= decode_start <= end)
