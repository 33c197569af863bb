"""``ForwardProgress``: a forwarding replica's progress for each pricing unit it forwards.

With sharded pricing the collector that prices a unit receives its records from several
replicas, each running behind the others by however long its assembly, its queue, its
retries and the route take. So each replica reports, per unit, how far it has come
(collector/cost/sources.py says how the pricing collector combines the reports):

- its own watermark for the unit, from the records it forwarded
  (:class:`~tokenpath.collector.cost.watermark.EventClock`: their newest engine time less
  the allowed lateness, and with the wall clock once the unit has been quiet here for
  ``min_delay_seconds``), the same rule a lone collector closes the unit by;
- lowered to the earliest start of anything the replica still holds that may become a
  record of any unit (``held_floor``: the assembler's traces, the pipeline queue, the call
  joiner's held records), never further back than ``max_delay_seconds`` (the longest
  lateness a lone collector would allow);
- with the number of the unit's records handed to the forwarder before it: the progress
  is queued behind them, so everything sent later comes from what the floor covered.

Thread contract: :meth:`observe` and :meth:`marks` run on the pipeline thread only (the
forwarder's ``consume_record`` and ``tick``), so what they read of the call joiner is
consistent; ``held_floor`` reads the assembler before the pipeline queue, so a trace
moving between them is seen in one of them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from tokenpath.collector.cost.watermark import EventClock, LatenessBounds
from tokenpath.collector.record_logs import OutgoingProgress, ResourceKey, resource_key
from tokenpath.records import RequestRecord

# A unit this replica forwarded nothing for this long is forgotten, after one final
# progress message that takes the replica out of the unit's minimum.
DEFAULT_UNIT_IDLE_SECONDS = 600.0


def _no_floor() -> float:
    return math.inf


@dataclass(slots=True)
class _Unit:
    clock: EventClock
    last_record: float = 0.0  # local clock


class ForwardProgress:
    """Per-unit progress of this replica (see the module doc)."""

    def __init__(self, bounds: LatenessBounds,
                 held_floor: Callable[[], float] = _no_floor,
                 clock: Callable[[], float] = time.time,
                 unit_idle_seconds: float = DEFAULT_UNIT_IDLE_SECONDS) -> None:
        self._bounds = bounds
        self._held_floor = held_floor
        self._clock = clock
        self._unit_idle_seconds = unit_idle_seconds
        self._units: dict[ResourceKey, _Unit] = {}
        # records of each unit handed to the forwarder, kept after the unit is dropped: a
        # count that restarted would be honoured before its records arrived
        self._sent: dict[ResourceKey, int] = {}

    def observe(self, record: RequestRecord) -> None:
        """``record`` is being handed to the forwarder."""
        key = resource_key(record.node, record.engine_id)
        unit = self._units.get(key)
        if unit is None:
            unit = _Unit(EventClock(self._bounds))
            self._units[key] = unit
        now = self._clock()
        self._sent[key] = self._sent.get(key, 0) + 1
        unit.last_record = now
        start, end = record.prefill_start_unix, record.engine_end_unix
        if (start is not None and end is not None and math.isfinite(start)
                and math.isfinite(end)):
            unit.clock.observe(start, end, now)

    def marks(self, final: bool = False) -> list[OutgoingProgress]:
        """One progress message per unit (``final``: the replica stops; every unit's last).
        A unit idle here for ``unit_idle_seconds`` gets its final message and is dropped."""
        now = self._clock()
        floor = max(self._held_floor(), now - self._bounds.max_delay_seconds)
        out: list[OutgoingProgress] = []
        for key, unit in list(self._units.items()):
            done = final or now - unit.last_record > self._unit_idle_seconds
            watermark = unit.clock.watermark(now)
            if floor < watermark:
                watermark = floor
            out.append(OutgoingProgress(key, self._sent[key], watermark, done))
            if done:
                del self._units[key]
        return out

    @property
    def units(self) -> int:
        return len(self._units)
