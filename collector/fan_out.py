"""``FanOut``: the attributor's one downstream, handing every record and idle slice to
each sink (collector/interfaces.py ``RecordSink``) in turn."""

from __future__ import annotations

import logging

from tokenpath import metric_names as M
from tokenpath.collector.interfaces import RecordSink
from tokenpath.records import IdleCost, RequestRecord
from tokenpath.telemetry import LabelledCount, Telemetry

log = logging.getLogger(__name__)


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
