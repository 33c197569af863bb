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


class MonotonicTotal:
    """One raw counter as a total that never goes backwards (same rule as
    :class:`MonotonicCounters`, without the keyed lookups; raw values must be valid)."""

    __slots__ = ("last", "total")

    def __init__(self) -> None:
        self.last: float | None = None
        self.total = 0.0

    def update(self, raw: float, wrap: int = 0) -> float:
        """Feed the latest raw reading; returns the total. With ``wrap`` (the counter's
        modulus, such as 2**32), a decrease is a wrap rather than a reset."""
        last = self.last
        if last is None:
            self.total = raw
        elif raw >= last:
            self.total += raw - last
        elif wrap:  # wrapped past its width once
            self.total += raw - last + wrap
        else:  # a reset: counting restarted from zero
            self.total += raw
        self.last = raw
        return self.total
