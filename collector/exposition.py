"""Request metrics kept for a fast /metrics scrape.

prometheus_client builds a Sample object per series on every scrape, which costs about
10 µs a series: 100 ms for the 10k series of a busy collector, against the target of
20 ms (docs/performance.md). The request metrics therefore live in these plain structures,
written by one thread (the pipeline's), and are rendered straight to the text exposition
format with label strings computed once per series. The collector's self-telemetry, a
few dozen series, stays on a prometheus_client registry; /metrics concatenates both.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Sequence

from tokenpath.metric_names import MetricSpec


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: Sequence[str], values: Sequence[str]) -> str:
    return ",".join(f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True))


def _num(value: float) -> str:
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    if value != value:
        return "NaN"
    return repr(float(value))


class CounterChild:
    __slots__ = ("labels", "value")

    def __init__(self, labels: str) -> None:
        self.labels = labels
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("counters only go up")
        self.value += amount


class _HistogramChild:
    """Bucket counts and a sum; the count is the buckets' total, so a scrape racing an
    observation never shows a ``_count`` other than the ``+Inf`` bucket."""

    __slots__ = ("bounds", "counts", "labels", "sum")

    def __init__(self, labels: str, bounds: tuple[float, ...]) -> None:
        self.labels = labels
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value


class _Family:
    def __init__(self, spec: MetricSpec) -> None:
        self.spec = spec
        self._lock = threading.Lock()

    def header(self) -> str:
        kind = "counter" if self.spec.type == "counter" else self.spec.type
        return (f"# HELP {self.spec.series} {self.spec.help}\n"
                f"# TYPE {self.spec.series} {kind}\n")


class FastCounter(_Family):
    def __init__(self, spec: MetricSpec) -> None:
        super().__init__(spec)
        self._children: dict[tuple[str, ...], CounterChild] = {}

    def labels(self, *values: str) -> CounterChild:
        child = self._children.get(values)
        if child is None:
            with self._lock:
                child = self._children.setdefault(
                    values, CounterChild(_labels(self.spec.labels, values)))
        return child

    def render(self, out: list[str]) -> None:
        if not self._children:
            return
        out.append(self.header())
        name = self.spec.series
        for child in list(self._children.values()):
            out.append(f"{name}{{{child.labels}}} {_num(child.value)}\n")


class FastHistogram(_Family):
    def __init__(self, spec: MetricSpec, buckets: Sequence[float]) -> None:
        super().__init__(spec)
        self._bounds = tuple(sorted(float(b) for b in buckets))
        self._le = [f'le="{_num(b)}"' for b in self._bounds] + ['le="+Inf"']
        self._children: dict[tuple[str, ...], _HistogramChild] = {}

    def labels(self, *values: str) -> _HistogramChild:
        child = self._children.get(values)
        if child is None:
            with self._lock:
                child = self._children.setdefault(
                    values, _HistogramChild(_labels(self.spec.labels, values), self._bounds))
        return child

    def render(self, out: list[str]) -> None:
        if not self._children:
            return
        name = self.spec.name
        out.append(f"# HELP {name} {self.spec.help}\n# TYPE {name} histogram\n")
        bucket = f"{name}_bucket{{"
        le = self._le
        for child in list(self._children.values()):
            prefix = bucket + child.labels + ("," if child.labels else "")
            cumulative = 0
            for i, n in enumerate(child.counts):
                cumulative += n
                out.append(f"{prefix}{le[i]}}} {cumulative}.0\n")
            braces = f"{{{child.labels}}}"
            out.append(f"{name}_count{braces} {cumulative}.0\n")
            out.append(f"{name}_sum{braces} {_num(child.sum)}\n")


def render(families: Sequence[FastCounter | FastHistogram]) -> str:
    out: list[str] = []
    for family in families:
        family.render(out)
    return "".join(out)
