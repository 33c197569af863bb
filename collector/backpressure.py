"""Admission and what it leaves: the receivers' view of a backed-up pipeline.

The rule (docs/reliability.md, "Backpressure"): a 200 / ``OK`` means the data is in the
collector's buffer and will reach the store. So nothing between the receivers and the
store drops a span or a record because a stage is slow:

- each stage that holds a backlog reports it as a :class:`Backlog` (what it holds now,
  and a high-water mark); the receivers refuse an export (429 with ``Retry-After`` /
  ``UNAVAILABLE`` with ``RetryInfo``) while any backlog it would add to is at or past its
  mark, before they read the body (:func:`first_over`);
- the queues behind the receivers never refuse what reaches them: the pipeline worker's
  queue is unbounded (its depth is bounded by admission), and the store's bounded queue
  makes the pipeline worker wait when full (back-pressure) instead of dropping; the
  worker's queue then grows past its mark and the receivers refuse.

A record that is still lost (the store already shut down) is counted in
``tokenpath_collector_records_dropped_total{reason}`` and logged at a bounded rate
(:class:`DropLog`), never once per record.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tokenpath.collector.stats import CollectorStats

# A queue's high-water mark, as a share of its size: past it the receivers shed load.
HIGH_WATER_FRACTION = 0.5
# The longest a burst of drops goes unlogged: one line per interval, with the count since.
DROP_LOG_SECONDS = 10.0

# reasons of tokenpath_collector_records_dropped_total
DROP_STORE_CLOSED = "store_closed"  # a record reached the store after it shut down


def high_water(capacity: int, fraction: float = HIGH_WATER_FRACTION) -> int:
    """The high-water mark of a queue of ``capacity`` items (at least 1)."""
    return max(1, int(capacity * fraction))


@dataclass(frozen=True, slots=True)
class Backlog:
    """One stage's backlog as admission sees it: ``depth()`` is what the stage holds now
    (read on every export request, so cheap), ``high_water`` the depth at which the
    receivers refuse new data."""

    name: str
    depth: Callable[[], int]
    high_water: int

    def over(self) -> bool:
        return self.depth() >= self.high_water

    def describe(self) -> str:
        return f"{self.name} at {self.depth()} (high-water mark {self.high_water})"


def first_over(backlogs: Iterable[Backlog]) -> Backlog | None:
    """The first backlog at or past its high-water mark: the reason to refuse; None
    admits."""
    for backlog in backlogs:
        if backlog.over():
            return backlog
    return None


class DropLog:
    """Counts records lost after admission, by reason, in ``stats.records_dropped``, and
    logs them at most once per ``every_seconds``: the first drop at once, later ones in one
    line with the count since the last line (and whatever is left at :meth:`flush`)."""

    def __init__(self, stats: CollectorStats, logger: logging.Logger, what: str,
                 every_seconds: float = DROP_LOG_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._stats = stats
        self._log = logger
        self._what = what
        self._every = every_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._since: dict[str, int] = {}
        self._last_line: float | None = None

    def drop(self, reason: str, n: int = 1) -> None:
        if n <= 0:
            return
        self._stats.records_dropped.inc(reason, n)
        with self._lock:
            self._since[reason] = self._since.get(reason, 0) + n
            now = self._clock()
            if self._last_line is not None and now - self._last_line < self._every:
                return
            counts = self._take(now)
        self._write(counts)

    def flush(self) -> None:
        """Log what was dropped since the last line (at shutdown)."""
        with self._lock:
            counts = self._take(self._clock())
        self._write(counts)

    def _take(self, now: float) -> dict[str, int]:
        counts, self._since = self._since, {}
        if counts:
            self._last_line = now
        return counts

    def _write(self, counts: dict[str, int]) -> None:
        if not counts:
            return
        total = sum(counts.values())
        reasons = ", ".join(f"{reason}: {n}" for reason, n in sorted(counts.items()))
        self._log.warning("%s: %d records dropped (%s); at most one such line every %g s; "
                          "tokenpath_collector_records_dropped_total counts them all",
                          self._what, total, reasons, self._every)
