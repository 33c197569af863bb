"""Energy per request, apportioned like dollars: measured where the agent reports GPU energy,
modeled where it does not.

The attributor splits each slice of a node's timeline (:mod:`.apportion`) between the
requests active in it by the same work weights as its dollars. A slice's joules are:

- **measured** when the node's agent pushes ``tokenpath_gpu_energy_joules_total`` (NVML's
  total-energy counter per GPU, or board power integrated where the counter is not
  supported) covering the slice: the sum over the node's GPUs of the counter's increase
  over the slice, read between samples as constant power (linear interpolation);
- **modeled** otherwise: the GPU's board power (TDP, from the datasheet in
  tokenpath/roofline.py) for each busy GPU-second, ``IDLE_POWER_FRACTION`` of it for each
  idle one (an idle H100 draws 70 to 100 W of its 700 W).

Either way the slice's joules go to its busy and idle GPU time in proportion to their
dollars, an idle GPU-second weighing ``IDLE_POWER_FRACTION`` of a busy one; the busy part
follows each request's dollars. So where measured, a node's per-request joules plus its
idle joules are the measured joules of its window. A record is ``measured`` when every
slice of its life was, else ``modeled``.

``GpuEnergyReadings`` keeps the counters per node (fed with the agent's metric points on
the ingest thread, read by the attributor on the pipeline worker).
"""

from __future__ import annotations

import bisect
import functools
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tokenpath import metric_names as M
from tokenpath.collector.receivers.otlp_decode import MetricPoint
from tokenpath.identity import node_of_resource
from tokenpath.roofline import GPUS
from tokenpath.stage_members import MEASURED, MODELED
from tokenpath.telemetry import LabelledCount, Telemetry

# a record's energy_provenance: the stage provenance spellings
ENERGY_MODELED = MODELED.value
ENERGY_MEASURED = MEASURED.value
IDLE_POWER_FRACTION = 0.15
DEFAULT_READINGS_HORIZON_SECONDS = 900.0  # samples kept per GPU (beyond the late horizon)
MAX_GPUS_PER_NODE = 64


def tdp_watts(gpu_type: str | None) -> float | None:
    spec = GPUS.get(gpu_type or "")
    return spec.tdp_watts if spec is not None and spec.tdp_watts > 0 else None


def modeled_joules_per_dollar(dollars_per_gpu_second: float, gpu_type: str | None) -> float:
    """Joules of one dollar of busy GPU time at the GPU's TDP (0 when TDP or price is
    unknown)."""
    watts = tdp_watts(gpu_type)
    if watts is None or dollars_per_gpu_second <= 0:
        return 0.0
    return watts / dollars_per_gpu_second


@dataclass(slots=True)
class _Counter:
    """One GPU's cumulative joules at its sample times (increasing)."""

    times: list[float] = field(default_factory=list)
    joules: list[float] = field(default_factory=list)
    offset: float = 0.0  # added after a reset (the agent restarted its integration)
    last_raw: float | None = None

    def add(self, t: float, raw: float, horizon: float) -> bool:
        """Append a sample; False when it is not newer than the last one. A value below
        the last one is a restarted counter: it continues from the last total."""
        if self.times and t <= self.times[-1]:
            return False
        reset = self.last_raw is not None and raw < self.last_raw
        if reset:
            self.offset = self.joules[-1] if self.joules else 0.0
        self.last_raw = raw
        self.times.append(t)
        self.joules.append(raw + self.offset)
        cut = bisect.bisect_left(self.times, t - horizon)
        if cut > 1:  # keep one sample before the horizon to interpolate from
            del self.times[:cut - 1]
            del self.joules[:cut - 1]
        return True

    def at(self, t: float) -> float | None:
        times = self.times
        if not times or t < times[0] or t > times[-1]:
            return None
        i = bisect.bisect_left(times, t)
        if times[i] == t:
            return self.joules[i]
        t0, t1 = times[i - 1], times[i]
        j0, j1 = self.joules[i - 1], self.joules[i]
        return j0 + (j1 - j0) * (t - t0) / (t1 - t0)


# outcomes of an energy point (tokenpath_collector_energy_readings_total{outcome})
READING_KEPT = "kept"
READING_OUT_OF_ORDER = "out_of_order"
READING_COUNTER_RESET = "counter_reset"  # kept, continuing from the last total
READING_OVER_GPU_CAP = "over_gpu_cap"  # a node past MAX_GPUS_PER_NODE


class EnergyReadingsStats(Telemetry):
    def __init__(self) -> None:
        self.readings = LabelledCount(M.ENERGY_READINGS)


class GpuEnergyReadings:
    """Per node, each GPU's energy counter over the last ``horizon_seconds``."""

    def __init__(self, horizon_seconds: float = DEFAULT_READINGS_HORIZON_SECONDS) -> None:
        self._horizon = horizon_seconds
        self._lock = threading.Lock()
        self._nodes: dict[str, dict[str, _Counter]] = {}
        self.stats = EnergyReadingsStats()

    def consume_points(self, points: Iterable[MetricPoint]) -> int:
        """Keep the GPU energy points among ``points``; returns how many were kept."""
        kept = 0
        with self._lock:
            for p in points:
                if p.name != M.GPU_ENERGY.name:
                    continue
                node = node_of_resource(p.resource)
                gpus = self._nodes.setdefault(node, {})
                gpu = str(p.attributes.get(M.LABEL_GPU, ""))
                counter = gpus.get(gpu)
                if counter is None:
                    if len(gpus) >= MAX_GPUS_PER_NODE:
                        self.stats.readings.inc(READING_OVER_GPU_CAP)
                        continue
                    counter = gpus[gpu] = _Counter()
                before = counter.offset
                if not counter.add(p.time_unix_nano / 1e9, p.value, self._horizon):
                    self.stats.readings.inc(READING_OUT_OF_ORDER)
                    continue
                if counter.offset != before:
                    self.stats.readings.inc(READING_COUNTER_RESET)
                self.stats.readings.inc(READING_KEPT)
                kept += 1
        return kept

    def known_until(self, node: str) -> float | None:
        """The latest time every GPU of ``node`` has a reading for (None: no readings)."""
        with self._lock:
            gpus = self._nodes.get(node)
            if not gpus:
                return None
            return min(c.times[-1] for c in gpus.values())

    def joules(self, node: str, start: float, end: float) -> float | None:
        """The node's GPUs' joules over ``[start, end]``; None unless every GPU's readings
        cover it."""
        with self._lock:
            gpus = self._nodes.get(node)
            if not gpus:
                return None
            total = 0.0
            for counter in gpus.values():
                a, b = counter.at(start), counter.at(end)
                if a is None or b is None:
                    return None
                total += b - a
            return total

    def meter(self, node: str) -> Callable[[float, float], float | None]:
        """The joules of one node's GPUs over ``(start, end)``, as the node timeline
        takes them."""
        return functools.partial(self.joules, node)
