"""The vLLM plugin's ``tokenpath.engine_steps`` interval spans, read into telemetry.

The stat-logger plugin (instrumentation/vllm/exporter.py) sends one such span per export
interval: the engine's steps and their seconds over the interval, and the plugin's own
cumulative drop and failure counts. They are not requests; the mapper hands them here
instead of counting them unmapped. Steps and step seconds add up per engine (each span
covers its own interval); the plugin's counts are cumulative, so the latest is kept.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Mapping

from tokenpath import attributes as A
from tokenpath import metric_names as M
from tokenpath.collector.spans import AttrValue, SpanData, attribute_number
from tokenpath.identity import identity_from
from tokenpath.labels import BoundedLabel
from tokenpath.telemetry import CountsRead, LabelledCount, Telemetry

DEFAULT_MAX_ENGINES = 200


def is_engine_steps_span(span: SpanData) -> bool:
    return span.name == A.SPAN_ENGINE_STEPS


def _count(value: AttrValue | None) -> float | None:
    """A finite, non-negative count from an attribute; None otherwise."""
    number = attribute_number(value)
    return number if number is not None and number >= 0 else None


class EngineStepsTelemetry(Telemetry):
    """Per engine: steps and step seconds reported, and the plugin's export health."""

    def __init__(self, max_engines: int = DEFAULT_MAX_ENGINES) -> None:
        self._engine = BoundedLabel(max_engines, M.LABEL_ENGINE)
        self._lock = threading.Lock()
        self._dropped: dict[Hashable, float] = {}
        self._failed: dict[Hashable, float] = {}
        self.steps = LabelledCount(M.ENGINE_PLUGIN_STEPS)
        self.step_seconds = LabelledCount(M.ENGINE_PLUGIN_STEP_SECONDS)
        self.export_dropped = CountsRead(M.ENGINE_PLUGIN_EXPORT_DROPPED,
                                         lambda: self._read(self._dropped))
        self.export_failed_batches = CountsRead(M.ENGINE_PLUGIN_EXPORT_FAILED,
                                                lambda: self._read(self._failed))

    def _read(self, counts: dict[Hashable, float]) -> Mapping[Hashable, float]:
        with self._lock:
            return dict(counts)

    def observe(self, span: SpanData) -> None:
        attributes = span.attributes
        identity = identity_from([attributes, span.resource])
        engine = self._engine(identity.engine or identity.node)
        steps = _count(attributes.get(A.STEP_COUNT))
        if steps is not None:
            self.steps.inc(engine, steps)
        seconds = _count(attributes.get(A.STEP_SECONDS))
        if seconds is not None:
            self.step_seconds.inc(engine, seconds)
        with self._lock:
            for key, counts in ((A.EXPORT_DROPPED, self._dropped),
                                (A.EXPORT_FAILED_BATCHES, self._failed)):
                value = _count(attributes.get(key))
                if value is not None:  # cumulative: a restarted plugin starts again
                    counts[engine] = value
