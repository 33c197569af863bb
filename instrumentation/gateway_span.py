"""The gateway shim's SERVER span, written straight to OTLP bytes where the SDK allows it.

On the OpenTelemetry SDK a span costs the gateway an SDK ``Span`` (a lock, bounded
attribute, event and link containers), an ``Event`` object and attribute mapping per
stage event, a ``ReadableSpan`` at the end, and then the encoding of all of it: about
half of what the shim cost a request (docs/performance.md, eighth A5 run). Yet the
shim writes a fixed kind of span: the sampler's attributes, its own plain attributes at
the end, its stage events, an error status or none. :class:`GatewaySpanWriter` starts
that span as the SDK ``Tracer.start_span`` does (the tracer's enabled state, its
sampler, id generator and self-metrics, the same ``SpanContext``), and keeps only
those fields; at the end it writes the span's OTLP ``Span`` message itself
(``otlp_encoder.encode_plain_span``: the bytes the SDK span would have been encoded
to) and queues it on the exporting processor.

It does so only where nothing else can see the difference:

- the tracer is the SDK's, with the internals of the SDK version this was written
  against (1.4x: ``_is_enabled``, ``_tracer_metrics``, ``_span_limits``,
  ``_instrumentation_scope``, and ``record_end_metrics`` on its ``_Span``), and its
  provider's only span processor is a :class:`TokenpathBatchSpanProcessor` in front of
  tokenpath's OTLP exporter (what the demo, the docs and ``tokenpath`` set up). Another
  processor, exporter or SDK: the SDK span, as before. A processor added later is seen
  at the next request;
- anything the app does to the span beyond the shim's own writes (``set_attribute``,
  ``add_event``, ``set_status``, ``record_exception``, links, a new name) turns it into
  an SDK span there and then (:meth:`GatewaySpan.sdk_span`, same context, start time
  and attributes), which from then on is the span, ended and exported by the SDK;
- at the end, attributes beyond the span's attribute limits or value length, or more
  stage events than its event limit, take the SDK span too, so limits and drop counts
  are the SDK's own; so does a failure to encode (counted in ``telemetry_errors``);
- a sampler's "record only" decision: the span records and is never exported, as the
  SDK's batch processor drops unsampled spans.

``GatewayConfig(direct_span_writing=False)`` turns the writer off. The tests drive the
shim both ways and compare the export bytes (tests/instrumentation/test_gateway_span.py).
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import Span as _SdkSpanBase
from opentelemetry.sdk.trace import SynchronousMultiSpanProcessor, Tracer
from opentelemetry.sdk.trace import _Span as _SdkSpan
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from tokenpath import attributes as attr
from tokenpath.instrumentation.otlp_encoder import (
    EncodedSpan,
    EventTemplate,
    TemplateKey,
    encode_plain_span,
    event_template,
)
from tokenpath.instrumentation.otlp_exporter import TokenpathBatchSpanProcessor
from tokenpath.instrumentation.safety import telemetry_errors
from tokenpath.instrumentation.span_attributes import set_span_attributes
from tokenpath.instrumentation.stage_recorder import (
    StageEntry,
    stage_event_attributes,
    write_stage_events,
)
from tokenpath.stages import Phase, Provenance, StageId

logger = logging.getLogger(__name__)

# What the writer reads of the SDK's Tracer beyond its public attributes; without all
# of them (another SDK version) the SDK span runs.
_TRACER_INTERNALS = ("_is_enabled", "_tracer_metrics", "_span_limits", "_instrumentation_scope")
_UNSET_STATUS = Status(StatusCode.UNSET)
_ERROR_STATUS = Status(StatusCode.ERROR)
_RANDOM_TRACE_ID = getattr(TraceFlags, "RANDOM_TRACE_ID", 0)
# the flags a span can start with, made once (TraceFlags is an int: one is as good as another)
_TRACE_FLAGS = {flags: TraceFlags(flags) for flags in
                {0, TraceFlags.SAMPLED, _RANDOM_TRACE_ID, TraceFlags.SAMPLED | _RANDOM_TRACE_ID}}


def _sdk_span_takes_end_metrics() -> bool:
    try:
        return "record_end_metrics" in inspect.signature(_SdkSpan.__init__).parameters
    except (TypeError, ValueError):  # pragma: no cover - a signature inspect cannot read
        return False


_SDK_SPAN_FITS = _sdk_span_takes_end_metrics()


class GatewaySpanWriter:
    """Starts the gateway's spans on one SDK tracer (see the module docstring)."""

    __slots__ = ("_processors", "_state", "_tracer")

    def __init__(self, tracer: Tracer, processors: SynchronousMultiSpanProcessor) -> None:
        self._tracer = tracer
        self._processors = processors
        # (the processors tuple last seen, the processor to queue on with it): one
        # attribute, so that a thread never pairs one tuple with another's processor
        self._state: tuple[object, TokenpathBatchSpanProcessor | None] = (None, None)

    @classmethod
    def for_tracer(cls, tracer: Any) -> GatewaySpanWriter | None:
        """A writer for ``tracer``, or None where the SDK span must be used."""
        if (type(tracer) is not Tracer or not _SDK_SPAN_FITS
                or not all(hasattr(tracer, name) for name in _TRACER_INTERNALS)):
            return None
        processors = tracer.span_processor
        if type(processors) is not SynchronousMultiSpanProcessor:
            return None
        return cls(tracer, processors)

    def processor(self) -> TokenpathBatchSpanProcessor | None:
        """The processor to queue on, while it is the provider's only one."""
        current = getattr(self._processors, "_span_processors", None)
        seen, processor = self._state
        if current is not seen:  # the tuple is replaced when a processor is added
            only = current[0] if isinstance(current, tuple) and len(current) == 1 else None
            processor = (only if type(only) is TokenpathBatchSpanProcessor
                         and only.encodes_at_end else None)
            self._state = (current, processor)
        return processor

    def start_span(self, name: str, context: otel_context.Context | None,
                   kind: SpanKind, attributes: Mapping[str, Any],
                   start_time: int | None = None) -> trace.Span:
        """``tracer.start_span(name, context, kind, attributes, start_time=...)``: a
        :class:`GatewaySpan` while the processor allows it, else the SDK's span."""
        tracer = self._tracer
        processor = self.processor()
        if processor is None:
            return tracer.start_span(name, context=context, kind=kind, attributes=attributes,
                                     start_time=start_time)
        # Tracer.start_span's steps, in its order (opentelemetry-sdk 1.4x)
        current = trace.get_current_span(context).get_span_context()
        if not tracer._is_enabled():
            return trace.NonRecordingSpan(context=current)
        id_generator = tracer.id_generator
        parent = current if current is not None and current.is_valid else None  # else a root
        trace_id = id_generator.generate_trace_id() if parent is None else parent.trace_id
        sampled = tracer.sampler.should_sample(context, trace_id, name, kind, attributes, ())
        decision: Any = sampled.decision  # the SDK's Decision methods are untyped
        flags = TraceFlags.SAMPLED if decision.is_sampled() else TraceFlags.DEFAULT
        random_id = (getattr(id_generator, "is_trace_id_random", bool)() if parent is None
                     else getattr(parent.trace_flags, "random_trace_id", False))
        if random_id:
            flags |= _RANDOM_TRACE_ID
        span_context = SpanContext(trace_id, id_generator.generate_span_id(), is_remote=False,
                                   trace_flags=_TRACE_FLAGS.get(flags) or TraceFlags(flags),
                                   trace_state=sampled.trace_state)
        end_metrics = tracer._tracer_metrics.start_span(parent, sampled.decision)
        if not decision.is_recording():
            return trace.NonRecordingSpan(context=span_context)
        return GatewaySpan(self, processor, name, span_context, parent, kind,
                           sampled.attributes, context, end_metrics,
                           start_time if start_time is not None else time.time_ns())

    def sdk_span(self, span: GatewaySpan) -> _SdkSpanBase:
        """An SDK span with ``span``'s context, start time and attributes, started."""
        tracer = self._tracer
        sdk = _SdkSpan(
            name=span._name, context=span._context, parent=span._parent,
            sampler=tracer.sampler, resource=tracer.resource,
            attributes=span._start_attributes, span_processor=tracer.span_processor,
            kind=span._kind, links=(), instrumentation_info=tracer.instrumentation_info,
            limits=tracer._span_limits, instrumentation_scope=tracer._instrumentation_scope,
            record_end_metrics=span._end_metrics,
        )
        sdk.start(start_time=span._start_time, parent_context=span._parent_context)
        return sdk


class GatewaySpan(trace.Span):
    """A recording span of the gateway shim that is written to OTLP bytes at its end.

    The shim ends it with :meth:`end_request`; anything else done to it goes to the SDK
    span it turns into (:meth:`sdk_span`)."""

    __slots__ = ("_context", "_end_metrics", "_end_time", "_kind", "_lock", "_name",
                 "_parent", "_parent_context", "_processor", "_sdk", "_start_attributes",
                 "_start_time", "_writer")

    def __init__(self, writer: GatewaySpanWriter, processor: TokenpathBatchSpanProcessor,
                 name: str, context: SpanContext, parent: SpanContext | None,
                 kind: SpanKind, start_attributes: Mapping[str, Any],
                 parent_context: otel_context.Context | None,
                 end_metrics: Callable[[], None], start_time: int) -> None:
        self._writer = writer
        self._processor = processor
        self._name = name
        self._context = context
        self._parent = parent
        self._kind = kind
        self._start_attributes = start_attributes
        self._parent_context = parent_context
        self._end_metrics = end_metrics
        self._start_time = start_time
        self._end_time: int | None = None
        self._sdk: _SdkSpanBase | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f'GatewaySpan(name="{self._name}", context={self._context})'

    # the Span API: the shim's own reads, and everything else through the SDK span
    def get_span_context(self) -> SpanContext:
        return self._context

    def is_recording(self) -> bool:
        sdk = self._sdk
        return self._end_time is None if sdk is None else sdk.is_recording()

    def sdk_span(self) -> trace.Span:
        """The SDK span this span is from now on (made on the first call). After the end
        without one, the ended span itself: calls on it are ignored with a warning, as
        the SDK ignores them on an ended span."""
        with self._lock:
            if self._sdk is None:
                if self._end_time is not None:
                    return _ENDED
                self._sdk = self._writer.sdk_span(self)
            return self._sdk

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        self.sdk_span().set_attributes(attributes)

    def set_attribute(self, key: str, value: Any) -> None:
        self.sdk_span().set_attribute(key, value)

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None,
                  timestamp: int | None = None) -> None:
        self.sdk_span().add_event(name, attributes, timestamp)

    def add_link(self, context: SpanContext, attributes: Mapping[str, Any] | None = None,
                 ) -> None:
        self.sdk_span().add_link(context, attributes)

    def update_name(self, name: str) -> None:
        self.sdk_span().update_name(name)

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        self.sdk_span().set_status(status, description)

    def record_exception(self, exception: BaseException,
                         attributes: Mapping[str, Any] | None = None,
                         timestamp: int | None = None, escaped: bool = False) -> None:
        self.sdk_span().record_exception(exception, attributes, timestamp, escaped)

    def end(self, end_time: int | None = None) -> None:
        self.end_request((), {}, error=False, end_time=end_time)

    def __exit__(self, exc_type: type[BaseException] | None, exc_val: BaseException | None,
                 exc_tb: TracebackType | None) -> None:
        if exc_val is not None and self.is_recording():  # the SDK span records it
            self.sdk_span().__exit__(exc_type, exc_val, exc_tb)
            return
        self.end()

    # the shim's end of the span
    def end_request(self, stages: Sequence[StageEntry], attributes: Mapping[str, Any],
                    error: bool, end_time: int | None = None) -> None:
        """End the span with the shim's stage events, end attributes (plain values) and
        status (an error, or unset): as the shim writes them on an SDK span
        (``write_stage_events``, ``set_span_attributes``, ``set_status``, ``end``)."""
        with self._lock:
            sdk = self._sdk
            if sdk is None:
                if self._end_time is not None:
                    logger.warning("Calling end() on an ended span.")
                    return
                self._end_time = end_time if end_time is not None else time.time_ns()
        if sdk is None:
            if not self._context.trace_flags.sampled:  # recorded, never exported
                self._end_metrics()
                return
            payload = self._encode(stages, attributes, error)
            if payload is not None:
                self._end_metrics()
                tracer = self._writer._tracer
                self._processor.on_end_encoded(
                    EncodedSpan(tracer.resource, tracer._instrumentation_scope, payload))
                return
            with self._lock:  # limits apply, or encoding failed: the SDK span's end
                sdk = self._sdk = self._writer.sdk_span(self)
            end_time = self._end_time
        set_span_attributes(sdk, attributes)
        if error:
            sdk.set_status(_ERROR_STATUS)
        write_stage_events(sdk, list(stages))
        sdk.end(end_time)

    def _encode(self, stages: Sequence[StageEntry], end_attributes: Mapping[str, Any],
                error: bool) -> bytes | None:
        """The span's ``Span`` message, or None where the SDK's limits would apply."""
        try:
            limits = self._writer._tracer._span_limits
            start = self._start_attributes
            attributes: tuple[Mapping[str, Any], ...] = (start, end_attributes)
            count = len(start) + len(end_attributes)
            if start and not start.keys().isdisjoint(end_attributes):
                merged = dict(start)  # the SDK moves a key set again to the end
                for key in end_attributes:
                    merged.pop(key, None)
                merged.update(end_attributes)
                attributes, count = (merged,), len(merged)
            max_attributes, max_events = limits.max_span_attributes, limits.max_events
            if ((max_attributes is not None and count > max_attributes)
                    or (max_events is not None and len(stages) > max_events)):
                return None
            assert self._end_time is not None
            return encode_plain_span(
                self._context, self._parent, self._name, self._kind, self._start_time,
                self._end_time, attributes, limits.max_span_attribute_length, stages,
                _stage_templates, _stage_template, _ERROR_STATUS if error else _UNSET_STATUS)
        except Exception as exc:
            telemetry_errors.count("gateway_span.encode", exc)
            return None


# A stage event's fields but its time and seconds, encoded once per stage, phase and
# provenance (15 x 3 x 3 at most; otlp_encoder.event_template). Keyed by the members'
# identities, as encode_plain_span looks them up (an Enum member hashes through Python
# code); the members live as long as their classes.
_stage_templates: dict[TemplateKey, EventTemplate] = {}


def _stage_template(stage: StageId, phase: Phase | None,
                    provenance: Provenance | None) -> EventTemplate:
    """The template of a stage's events: ``stage_event_attributes`` in its order."""
    attributes = stage_event_attributes(stage, 0.0, phase, provenance)
    keys = list(attributes)
    if keys[:2] != [attr.STAGE, attr.STAGE_SECONDS]:  # pragma: no cover - the contract
        raise ValueError("stage event attributes do not start with stage, seconds")
    template = _stage_templates[(id(stage), id(phase), id(provenance))] = event_template(
        attr.STAGE_EVENT, {attr.STAGE: attributes[attr.STAGE]}, attr.STAGE_SECONDS,
        {key: attributes[key] for key in keys[2:]})
    return template


class _EndedSpan(trace.NonRecordingSpan):
    """What an ended :class:`GatewaySpan` hands out for later calls: each is ignored with
    the SDK's warning for a call on an ended span."""

    def _ignored(self, *args: Any, **kwargs: Any) -> None:
        logger.warning("Calling a method on an ended span is ignored.")

    set_attributes = set_attribute = add_event = add_link = _ignored  # type: ignore[assignment]
    update_name = set_status = record_exception = end = _ignored  # type: ignore[assignment]


_ENDED = _EndedSpan(trace.INVALID_SPAN_CONTEXT)
