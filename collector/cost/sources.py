"""The sources of a pricing unit's forwarded records, and how far each has come.

With sharded pricing (docs/deploy.md) a unit's records reach its pricing collector from
every replica that mapped some of them (a *source*). Each source reports its progress
for the unit: its own watermark (:mod:`.watermark`, lowered to the oldest work it still
holds that may become a record of the unit) and the number of the unit's records it had
sent before it (:class:`SourceProgress`). Posts may be reordered on the way (batch
processors, exporter queues, retries), so a progress message is honoured only once this
collector holds that many of the source's records for the unit.

A unit's window advances to the minimum over its live sources, as a stream processor
combines its inputs' watermarks:

- a source is known from its first message (a record or a progress message);
- for ``source_discovery_seconds`` after the unit's first message its window does not
  move at all, so the first replica heard from (a backlog's, say) cannot close the window
  before the others are heard from;
- a source that sent no progress for ``source_timeout_seconds`` leaves the minimum
  (counted; a later progress message brings it back), and a source that said it stopped
  (a clean shutdown's final progress) leaves it once its records are all here;
- with no live source left, the unit is closed as a lone collector closes it
  (:meth:`.watermark.EventClock.watermark` over the records it received).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SourceProgress:
    """One progress message: ``source`` had sent ``records`` of ``unit``'s records when
    it promised that every later one starts (engine time) at or after ``watermark``;
    ``final``: it will send no more (it is shutting down)."""

    unit: str
    source: str
    records: int
    watermark: float
    final: bool = False


class _Source:
    __slots__ = ("expired", "final", "heard", "honoured", "latest", "pending", "received")

    def __init__(self, now: float) -> None:
        self.received = 0  # records of the unit held from this source
        self.honoured = -math.inf  # the highest honoured watermark
        self.pending: list[SourceProgress] = []  # waiting for their records
        self.heard = now  # local clock of its last message (first: its first record)
        self.final = False  # its latest honoured progress said it stopped
        self.latest = -1  # the record count of its latest honoured progress
        self.expired = False

    def honour(self) -> None:
        if not self.pending:
            return
        waiting: list[SourceProgress] = []
        for mark in self.pending:
            if mark.records <= self.received:
                if mark.watermark > self.honoured:
                    self.honoured = mark.watermark
                if mark.records >= self.latest:  # a later message (a resumed unit)
                    self.latest = mark.records
                    self.final = mark.final
            else:
                waiting.append(mark)
        self.pending = waiting


class UnitSources:
    """One unit's sources (see the module doc). Single-threaded: the attributor's."""

    __slots__ = ("_sources", "first_heard")

    def __init__(self, now: float) -> None:
        self.first_heard = now
        self._sources: dict[str, _Source] = {}

    def _source(self, source: str, now: float) -> _Source:
        found = self._sources.get(source)
        if found is None:
            found = _Source(now)
            self._sources[source] = found
        return found

    def record(self, source: str, now: float) -> None:
        """A record of the unit from ``source`` (not a duplicate) is now held."""
        found = self._source(source, now)
        found.received += 1
        found.honour()

    def progress(self, mark: SourceProgress, now: float) -> None:
        found = self._source(mark.source, now)
        found.heard = now
        found.expired = False
        found.pending.append(mark)
        found.honour()

    def watermark(self, now: float, discovery_seconds: float, timeout_seconds: float,
                  on_expired: Callable[[str], None]) -> float | None:
        """The minimum over the live sources' honoured watermarks; ``-inf`` while the
        unit is still discovering its sources; None when no source is live (the caller
        closes the unit as a lone collector would)."""
        if now - self.first_heard < discovery_seconds:
            return -math.inf
        lowest = math.inf
        live = False
        for name, source in self._sources.items():
            if source.final and not source.pending:
                continue
            if now - source.heard >= timeout_seconds:
                if not source.expired:
                    source.expired = True
                    on_expired(name)
                continue
            live = True
            if source.honoured < lowest:
                lowest = source.honoured
        return lowest if live else None

    def forget_gone(self, now: float, horizon_seconds: float) -> None:
        """Drop the sources that expired or stopped longer than ``horizon_seconds`` ago (a
        replica that restarted is a new source; the old one's name would stay forever)."""
        for name in [n for n, s in self._sources.items()
                     if (s.expired or s.final) and now - s.heard > horizon_seconds]:
            del self._sources[name]

    @property
    def names(self) -> list[str]:
        return list(self._sources)
