"""The narrow interfaces between collector components.

receivers -> assembler -> mapper -> attributor -> sinks. Each component is given its
downstream at construction and knows nothing else about the pipeline.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from tokenpath import metric_names as M
from tokenpath.records import RequestRecord
from tokenpath.telemetry import LabelledCount, Telemetry

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class IdleCost:
    """GPU dollars of a pool's time slice in which no request was active."""

    pool: str
    start_unix: float
    end_unix: float
    dollars: float
    energy_joules: float = 0.0  # measured or modeled (collector/cost/energy.py)


class RecordSink(Protocol):
    """Downstream of the attributor: Prometheus exposition, the store, the UI feed."""

    def consume_record(self, record: RequestRecord) -> None: ...

    def consume_idle_cost(self, idle: IdleCost) -> None: ...

    def shutdown(self) -> None: ...


class FanOutTelemetry(Telemetry):
    def __init__(self) -> None:
        self.sink_errors = LabelledCount(M.SINK_ERRORS)  # by sink class


class FanOut:
    """Hands every record and idle slice to each sink in turn; one failing sink never
    starves the others. Failures are counted in ``errors`` and logged."""

    def __init__(self, sinks: list[RecordSink]) -> None:
        self._sinks = list(sinks)
        self.telemetry = FanOutTelemetry()

    def consume_record(self, record: RequestRecord) -> None:
        for sink in self._sinks:
            try:
                sink.consume_record(record)
            except Exception:
                self._failed(sink)

    def consume_idle_cost(self, idle: IdleCost) -> None:
        for sink in self._sinks:
            try:
                sink.consume_idle_cost(idle)
            except Exception:
                self._failed(sink)

    def _failed(self, sink: RecordSink) -> None:
        name = type(sink).__name__
        self.telemetry.sink_errors.inc(name)
        log.exception("sink %s failed (%d failures so far)", name,
                      self.telemetry.sink_errors[name])

    def shutdown(self) -> None:
        for sink in self._sinks:
            sink.shutdown()
