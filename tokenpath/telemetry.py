"""Self-telemetry instruments, each declared once from its :class:`MetricSpec`.

A component owns a holder (a :class:`Telemetry` subclass) whose attributes are
instruments built from the specs in :mod:`tokenpath.metric_names`. The collector's
exporter (:class:`tokenpath.collector.prometheus_sink.TelemetryExporter`) walks every
instrument of every holder it is given, so a counter that exists is a counter on
``/metrics``: there is no second list to forget it in, and no counter named by a string.

No Prometheus in here: instruments are plain, thread-safe numbers that tests read
directly (``stats.records_stored.value``, ``stats.spans_dropped["late"]``).
"""

from __future__ import annotations

import threading
from collections import Counter as _Counts
from collections.abc import Callable, Hashable, Iterator, Mapping

from tokenpath.metric_names import MetricSpec

LabelKey = str | tuple[str, ...]


class Count:
    """An unlabelled counter."""

    __slots__ = ("_lock", "_value", "spec")

    def __init__(self, spec: MetricSpec) -> None:
        _check(spec, "counter", 0)
        self.spec = spec
        self._lock = threading.Lock()
        self._value: float = 0

    def inc(self, n: float = 1) -> None:
        if n:
            with self._lock:
                self._value += n

    @property
    def value(self) -> float:
        return self._value


class LabelledCount(_Counts[Hashable]):
    """A counter with labels: counts by label value (one label) or tuple of values. Reads
    as a ``collections.Counter``."""

    def __init__(self, spec: MetricSpec) -> None:
        super().__init__()
        _check(spec, "counter", None)
        self.spec = spec
        self._lock = threading.Lock()

    def inc(self, key: LabelKey, n: float = 1) -> None:
        if n:
            with self._lock:
                self[key] += n  # type: ignore[assignment]

    def snapshot(self) -> list[tuple[Hashable, float]]:
        with self._lock:
            return sorted(self.items(), key=lambda item: str(item[0]))


class Level:
    """A gauge: the value set last, or read from ``read`` at scrape time."""

    __slots__ = ("_read", "_value", "spec")

    def __init__(self, spec: MetricSpec, read: Callable[[], float] | None = None) -> None:
        _check(spec, "gauge", 0)
        self.spec = spec
        self._read = read
        self._value: float = 0

    def set(self, value: float) -> None:
        self._value = value

    @property
    def value(self) -> float:
        return self._read() if self._read is not None else self._value


class CountsRead:
    """A labelled counter whose counts another object keeps, read at scrape time (a bounded
    label's overflow count, kept by the label)."""

    __slots__ = ("_read", "spec")

    def __init__(self, spec: MetricSpec, read: Callable[[], Mapping[Hashable, float]]) -> None:
        _check(spec, "counter", None)
        self.spec = spec
        self._read = read

    def snapshot(self) -> list[tuple[Hashable, float]]:
        return sorted(self._read().items(), key=lambda item: str(item[0]))


Instrument = Count | LabelledCount | Level | CountsRead


class Telemetry:
    """A component's telemetry: every instrument attribute is exported."""

    def instruments(self) -> Iterator[Instrument]:
        names = getattr(self, "__slots__", None) or getattr(self, "__dict__", None)
        if names is None:  # a compiled class (tokenpath/compiled.py) keeps no __dict__
            names = [name for name in dir(self) if not name.startswith("__")]
        for name in names:
            value = getattr(self, name, None)
            if isinstance(value, Instrument):
                yield value


def _check(spec: MetricSpec, kind: str, labels: int | None) -> None:
    if spec.type != kind:
        raise ValueError(f"{spec.name} is a {spec.type}, not a {kind}")
    if labels is not None and len(spec.labels) != labels:
        raise ValueError(f"{spec.name} has labels {spec.labels}")
    if labels is None and not spec.labels:
        raise ValueError(f"{spec.name} has no labels: use Count")
