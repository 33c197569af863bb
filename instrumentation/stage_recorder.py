"""The hook API: record many stage timings onto one span, cheaply.

A :class:`StageRecorder` collects ``(stage, seconds, phase, provenance, end time)``
tuples in a plain list while the request runs (a list append per stage) and writes them
as ``STAGE_EVENT`` span events on its span in :meth:`StageRecorder.flush`, just before
the span ends. That is the stage-recording form 2 of the collector contract; it costs a
fraction of creating one span per stage (see ``bench/stage_recording.py``).

Fast path: on the OpenTelemetry SDK's span the events go into the span's event list
(``Span._events``, the SDK's ``BoundedList``, which applies the span's event limit) in
one ``extend``, with small immutable attribute dicts built here. That skips, per event,
the ``BoundedAttributes`` copy (our events have at most four attributes with short
values, so the attribute limits could never apply) and the two lock round trips of
``Span.add_event``; the span's lock is taken once, as the SDK's event methods take it. A
span that has ended takes no events, as with ``add_event``. Any other span (a no-op span,
another SDK) gets the public ``add_event``. Every failure is caught and counted, never
raised. The fast path reads the SDK's private internals, so it runs only on the
OpenTelemetry versions it is tested on (``sdk_compat``); on any other every flush takes
``add_event``, counted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.trace import Span

from tokenpath import attributes as attr
from tokenpath.instrumentation.safety import telemetry_errors
from tokenpath.instrumentation.sdk_compat import fast_path
from tokenpath.stages import PLAIN_VALUES, Phase, Provenance, StageId

try:  # the SDK's event and bounded-list classes, for the fast path
    from opentelemetry.sdk.trace import Event as _SdkEvent
    from opentelemetry.sdk.util import BoundedList as _SdkBoundedList
except ImportError:  # pragma: no cover - the SDK is a dependency
    _SdkEvent = None  # type: ignore[assignment,misc]
    _SdkBoundedList = None  # type: ignore[assignment,misc]

logger = logging.getLogger(__name__)

# (stage, seconds, phase, provenance, end time in ns since the epoch)
StageEntry = tuple[StageId, float, Phase | None, Provenance | None, int]


def stage_event_attributes(
    stage: StageId, seconds: float, phase: Phase | None, provenance: Provenance | None
) -> dict[str, Any]:
    """The attributes of one ``STAGE_EVENT`` span event."""
    out: dict[str, Any] = {attr.STAGE: PLAIN_VALUES[stage], attr.STAGE_SECONDS: float(seconds)}
    if phase is not None:
        out[attr.PHASE] = PLAIN_VALUES[phase]
    if provenance is not None and provenance is not Provenance.MEASURED:
        out[attr.PROVENANCE] = PLAIN_VALUES[provenance]
    return out


class StageRecorder:
    """Stage timings of one request, written as span events on one span at flush."""

    __slots__ = ("_entries", "_flushed", "span")

    def __init__(self, span: Span) -> None:
        self.span = span
        self._entries: list[StageEntry] = []
        self._flushed = False

    def record(
        self,
        stage: StageId,
        seconds: float,
        phase: Phase | None = None,
        provenance: Provenance | None = None,
        end_ns: int | None = None,
    ) -> None:
        """Note that ``stage`` took ``seconds`` (ending now unless ``end_ns`` is given)."""
        self._entries.append(
            (stage, seconds, phase, provenance, end_ns if end_ns is not None else time.time_ns())
        )

    def record_all(self, entries: Iterable[StageEntry]) -> None:
        """:meth:`record` for several entries made by the caller."""
        self._entries.extend(entries)

    @contextmanager
    def stage(self, stage: StageId, phase: Phase | None = None) -> Iterator[None]:
        """Time the ``with`` body as ``stage`` (measured)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._entries.append((stage, time.perf_counter() - start, phase, None, time.time_ns()))

    @property
    def entries(self) -> list[StageEntry]:
        return list(self._entries)

    def seconds(self, *stages: StageId) -> float:
        """Total recorded seconds of ``stages`` so far (all phases)."""
        total = 0.0
        for entry in self._entries:
            if entry[0] in stages:
                total += entry[1]
        return total

    def flush(self) -> None:
        """Write the recorded stages as span events. Idempotent; never raises."""
        if self._flushed:
            return
        self._flushed = True
        try:
            write_stage_events(self.span, self._entries)
        except Exception as exc:
            telemetry_errors.count("stage_recorder.flush", exc)


def add_stage_events(span: Span, entries: list[StageEntry]) -> None:
    """Append one ``STAGE_EVENT`` per entry to ``span`` by the public ``add_event``."""
    for stage, seconds, phase, provenance, end_ns in entries:
        span.add_event(
            attr.STAGE_EVENT, stage_event_attributes(stage, seconds, phase, provenance), end_ns
        )


@fast_path("stage_recorder.write_stage_events", add_stage_events)
def write_stage_events(span: Span, entries: list[StageEntry]) -> None:
    """Append one ``STAGE_EVENT`` per entry to ``span`` (SDK fast path when available)."""
    sdk_events = getattr(span, "_events", None)
    span_lock = getattr(span, "_lock", None)
    if (_SdkEvent is not None and isinstance(sdk_events, _SdkBoundedList)
            and span_lock is not None):
        events = [
            _SdkEvent(attr.STAGE_EVENT,
                      stage_event_attributes(stage, seconds, phase, provenance), end_ns)
            for stage, seconds, phase, provenance, end_ns in entries
        ]
        # Under the span's lock, as the SDK's own event methods: a span another thread
        # ends meanwhile either takes all the events first or none of them.
        with span_lock:
            if span.is_recording():
                sdk_events.extend(events)
                return
        logger.warning("tokenpath: %d stage events not added to an ended span", len(events))
        return
    add_stage_events(span, entries)
