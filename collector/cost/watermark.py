"""A pricing unit's event-time watermark: how far its timeline may be closed.

One :class:`EventClock` per unit, wherever a unit's records are seen: in the pricing
collector's attributor (its own records) and in each forwarding replica (the records it
sends on, whose watermark it reports as its progress, :mod:`.sources`). Its watermark is

    W = F - L                        while the unit receives records
    W = F - L + (now - A - min_delay) once it has received nothing for min_delay (quiet)

- ``F``, the unit's event time: the latest engine end among its records, never ahead of
  the local clock (a bogus timestamp cannot close the window ahead of the records);
- ``L``, its allowed lateness: the longest event-time lag ``F - prefill_start`` among its
  last ``lag_window`` records, plus ``lag_margin_seconds``, bounded by
  ``min_delay_seconds`` and ``max_delay_seconds``;
- ``A``, the local clock when its last record arrived.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LatenessBounds:
    """The attributor's ``cost.*`` keys that shape a unit's allowed lateness."""

    min_delay_seconds: float
    max_delay_seconds: float
    lag_window: int
    lag_margin_seconds: float


class LagWindow:
    """Sliding-window maximum of a unit's recent event-time lags."""

    __slots__ = ("_lags", "_sequence", "_window")

    def __init__(self, window: int) -> None:
        self._window = window
        self._sequence = 0
        self._lags: deque[tuple[int, float]] = deque()  # (sequence, lag), lags decreasing

    def observe(self, lag: float) -> None:
        self._sequence += 1
        while self._lags and self._lags[-1][1] <= lag:
            self._lags.pop()
        self._lags.append((self._sequence, lag))
        while self._lags[0][0] <= self._sequence - self._window:
            self._lags.popleft()

    @property
    def maximum(self) -> float | None:
        return self._lags[0][1] if self._lags else None


class EventClock:
    """One unit's event time, allowed lateness and watermark (see the module doc)."""

    __slots__ = ("_bounds", "frontier", "lags", "last_arrival")

    def __init__(self, bounds: LatenessBounds) -> None:
        self._bounds = bounds
        self.lags = LagWindow(bounds.lag_window)
        self.frontier = -math.inf  # F
        self.last_arrival = 0.0  # A (local clock)

    def observe(self, prefill_start: float, engine_end: float, now: float) -> None:
        """A record of the unit arrived at ``now`` (local clock)."""
        self.last_arrival = now
        seen = engine_end if engine_end < now else now
        if seen > self.frontier:
            self.frontier = seen
        self.lags.observe(self.frontier - prefill_start)

    def lateness(self) -> float:
        bounds = self._bounds
        lag = self.lags.maximum
        lag = 0.0 if lag is None else lag + bounds.lag_margin_seconds
        return min(bounds.max_delay_seconds, max(bounds.min_delay_seconds, lag))

    def stop(self) -> float:
        """``F - L``: where the unit may be closed as a record arrives."""
        return self.frontier - self.lateness()

    def watermark(self, now: float) -> float:
        """``F - L``, plus the wall time past ``min_delay_seconds`` of quiet."""
        stop = self.stop()
        quiet = now - self.last_arrival - self._bounds.min_delay_seconds
        return stop + quiet if quiet > 0.0 else stop
