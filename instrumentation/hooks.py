"""The hook API: record many stage timings onto one span, cheaply.

A :class:`StageRecorder` collects ``(stage, seconds, phase, provenance, end time)``
tuples in a plain list while the request runs (a list append per stage) and writes them
as ``STAGE_EVENT`` span events on its span in :meth:`StageRecorder.flush`, just before
the span ends. That is the stage-recording form 2 of the collector contract; it costs a
fraction of creating one span per stage (see ``bench/stage_recording.py``).

Fast path: on the OpenTelemetry SDK's span the events are appended through
``Span._add_event`` with small immutable attribute dicts built here, skipping the
per-event ``BoundedAttributes`` copy (our events have at most four attributes with short
values, so the limits could never apply). Any other span (a no-op span, another SDK)
gets the public ``add_event``. Every failure is caught and counted, never raised.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.trace import Span

from tokenpath import attributes as attr
from tokenpath.instrumentation.safety import telemetry_errors
from tokenpath.stages import Phase, Provenance, StageId

try:  # the SDK's event class, for the fast path
    from opentelemetry.sdk.trace import Event as _SdkEvent
except ImportError:  # pragma: no cover - the SDK is a dependency
    _SdkEvent = None  # type: ignore[assignment,misc]

# (stage, seconds, phase, provenance, end time in ns since the epoch)
StageEntry = tuple[StageId, float, Phase | None, Provenance | None, int]


def stage_event_attributes(
    stage: StageId, seconds: float, phase: Phase | None, provenance: Provenance | None
) -> dict[str, Any]:
    """The attributes of one ``STAGE_EVENT`` span event."""
    out: dict[str, Any] = {attr.STAGE: stage.value, attr.STAGE_SECONDS: float(seconds)}
    if phase is not None:
        out[attr.PHASE] = phase.value
    if provenance is not None and provenance is not Provenance.MEASURED:
        out[attr.PROVENANCE] = provenance.value
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

    def seconds(self, stage: StageId) -> float:
        """Total recorded seconds of ``stage`` so far (all phases)."""
        return sum(entry[1] for entry in self._entries if entry[0] is stage)

    def flush(self) -> None:
        """Write the recorded stages as span events. Idempotent; never raises."""
        if self._flushed:
            return
        self._flushed = True
        try:
            write_stage_events(self.span, self._entries)
        except Exception as exc:
            telemetry_errors.count("hooks.flush", exc)


def write_stage_events(span: Span, entries: list[StageEntry]) -> None:
    """Append one ``STAGE_EVENT`` per entry to ``span`` (SDK fast path when available)."""
    add_sdk_event = getattr(span, "_add_event", None)
    if _SdkEvent is not None and add_sdk_event is not None:
        for stage, seconds, phase, provenance, end_ns in entries:
            add_sdk_event(
                _SdkEvent(
                    attr.STAGE_EVENT,
                    stage_event_attributes(stage, seconds, phase, provenance),
                    end_ns,
                )
            )
        return
    for stage, seconds, phase, provenance, end_ns in entries:
        span.add_event(
            attr.STAGE_EVENT, stage_event_attributes(stage, seconds, phase, provenance), end_ns
        )
