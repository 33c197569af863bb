"""Cumulative totals that never go backwards, from raw counters that may reset.

A GPU reset zeroes NVML's NVLink counters, an engine restart zeroes its /metrics
counters, a re-created NIC zeroes its statistics. The agent keeps, per raw series, the
last raw value and a running total: an increase adds the difference, a decrease is read
as a reset to zero followed by the new raw value's worth of counting (Prometheus'
``rate()`` rule). The first sighting starts the total at the raw value.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from operator import add, ge


class MonotonicCounters:
    """Per-key accumulators; at most ``max_keys`` keys (new keys past it are refused)."""

    def __init__(self, max_keys: int = 65536) -> None:
        self._max_keys = max_keys
        self._last: dict[Hashable, float] = {}
        self._total: dict[Hashable, float] = {}
        self.resets = 0
        self.refused = 0

    def update(self, key: Hashable, raw: float) -> float | None:
        """Feed one raw reading; returns the monotonic total, or ``None`` when the key
        was refused for the cap (or never seen and ``raw`` is not a usable number)."""
        last = self._last.get(key)
        if not math.isfinite(raw) or raw < 0:
            return self._total.get(key)
        if last is None:
            if len(self._last) >= self._max_keys:
                self.refused += 1
                return None
            total = raw
        elif raw >= last:
            total = self._total[key] + (raw - last)
        else:
            self.resets += 1
            total = self._total[key] + raw
        self._last[key] = raw
        self._total[key] = total
        return total

    def total(self, key: Hashable) -> float | None:
        return self._total.get(key)

    def __len__(self) -> int:
        return len(self._last)


class CounterGroup:
    """Counters read together (one NIC's statistics, one GPU's NVLink and PCIe pairs) as
    totals that never go backwards.

    A total is the raw value plus an offset. When a raw value decreases, its offset grows
    by the counter's width if it has one in ``widths`` and the previous value was in the
    upper half of that width (it wrapped: 2**32 for a 32-bit counter), else by the
    previous raw value (a reset to zero, the rule above; a counter that was low cannot
    have wrapped within one reading without aliasing anyway). A group
    that never decreased returns its raw values as totals, with no arithmetic; ``widths``
    may be set after construction, once the caller knows them.
    """

    __slots__ = ("last", "offsets", "widths")

    def __init__(self, widths: tuple[int, ...] | None = None) -> None:
        self.last: tuple[float, ...] | None = None
        self.offsets: tuple[float, ...] | None = None
        self.widths = widths

    def select(self, indices: tuple[int, ...]) -> CounterGroup:
        """A group of only the counters at ``indices``, with their history (for a reader
        that stops asking for some of its counters)."""
        group = CounterGroup(None if self.widths is None
                             else tuple(self.widths[i] for i in indices))
        if self.last is not None:
            group.last = tuple(self.last[i] for i in indices)
        if self.offsets is not None:
            group.offsets = tuple(self.offsets[i] for i in indices)
        return group

    def update(self, raws: tuple[float, ...]) -> tuple[float, ...]:
        """Feed one reading of every counter (the first sighting starts at the raw
        values); returns the totals."""
        last = self.last
        if last is not None and not all(map(ge, raws, last)):
            count = len(raws)
            widths = self.widths or (0,) * count
            self.offsets = tuple(
                offset + (width if previous * 2 > width > 0 else previous)
                if raw < previous else offset
                for offset, raw, previous, width in zip(
                    self.offsets or (0.0,) * count, raws, last, widths, strict=True))
        self.last = raws
        offsets = self.offsets
        return raws if offsets is None else tuple(map(add, raws, offsets))
