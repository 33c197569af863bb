"""Off-engine-loop export for the vLLM plugin.

The engine loop only calls :meth:`AnnotationExporter.submit`, a non-blocking put into a
bounded queue (a full queue drops the item and counts it). A daemon thread drains the
queue, keeps the step window, turns finished requests into ``SPAN_REQUEST_ANNOTATION``
spans and each flush interval's steps into a ``SPAN_ENGINE_STEPS`` span, and hands them
to an OpenTelemetry ``SpanExporter`` (OTLP to the tokenpath collector in production).
Nothing here raises into the caller.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    TraceFlags,
    set_span_in_context,
)

from tokenpath import attributes as attr
from tokenpath.instrumentation.request_ids import trace_of
from tokenpath.instrumentation.vllm.config import SERVICE_NAME as DEFAULT_SERVICE_NAME
from tokenpath.instrumentation.vllm.config import PluginConfig
from tokenpath.instrumentation.vllm.steps import EngineStep, StepSummary, StepWindow

log = logging.getLogger(__name__)

ENGINE_NAME = "vllm"
SCOPE_NAME = "tokenpath.instrumentation.vllm"
SHUTDOWN_JOIN_SECONDS = 5.0
# Slack before a request's first scheduled moment when picking the steps it was part of:
# the frontend stamps a step when it processes its output, a little after the step ran.
STEP_MATCH_SLACK_SECONDS = 0.0


@dataclass(frozen=True, slots=True)
class FinishedRequest:
    """What the plugin keeps of vLLM's ``FinishedRequestStats`` (never any content)."""

    request_id: str
    finished_unix: float
    cached_tokens: int
    preemptions: int
    prompt_tokens: int
    generation_tokens: int
    inference_seconds: float
    finish_reason: str


_STOP = object()


def build_span_exporter(config: PluginConfig) -> SpanExporter:
    """The OTLP span exporter for ``config.endpoint`` (gRPC ``HOST:PORT`` or HTTP URL)."""
    headers = {"authorization": f"Bearer {config.auth_token}"} if config.auth_token else None
    if config.uses_http:  # the stock OTLP/HTTP exporter with tokenpath's span encoder
        from tokenpath.instrumentation.otlp_exporter import TokenpathOTLPSpanExporter

        return TokenpathOTLPSpanExporter(
            endpoint=config.endpoint.rstrip("/") + "/v1/traces", headers=headers
        )
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
        OTLPSpanExporter as GrpcSpanExporter,
    )

    return GrpcSpanExporter(endpoint=config.endpoint, insecure=True, headers=headers)


def served_model_name(vllm_config: Any) -> str | None:
    """The name vLLM serves its model under (``--served-model-name``, else the model path):
    the first of several, as vLLM's own metrics label it (``model_name``)."""
    name = getattr(getattr(vllm_config, "model_config", None), "served_model_name", None)
    if isinstance(name, (list, tuple)):
        name = name[0] if name else None
    return name if isinstance(name, str) and name else None


class AnnotationExporter:
    """Bounded hand-off from vLLM's engine loop to an export thread."""

    def __init__(
        self,
        config: PluginConfig,
        span_exporter: SpanExporter,
        clock: Callable[[], float] = time.time,
        served_model_name: str | None = None,
    ) -> None:
        self._config = config
        self._span_exporter = span_exporter
        self._clock = clock
        self._queue: queue.Queue[object] = queue.Queue(maxsize=config.queue_size)
        self._window = StepWindow(config.step_window)
        resource: dict[str, Any] = {SERVICE_NAME: DEFAULT_SERVICE_NAME}
        self._common: dict[str, Any] = {attr.ENGINE: ENGINE_NAME}
        if config.node:
            self._common[attr.NODE] = config.node
        if config.pool:
            self._common[attr.POOL] = config.pool
        # the engine's served model name on each request annotation: the records name
        # their model even where no other hop does (docs/vllm.md)
        self._request_common = dict(self._common)
        if served_model_name:
            self._request_common[attr.GEN_AI_RESPONSE_MODEL] = served_model_name
        self._tracer = TracerProvider(
            resource=Resource.create(resource), shutdown_on_exit=False
        ).get_tracer(SCOPE_NAME)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stopped = False
        self._interval_start = clock()
        self.dropped = 0
        self.failed_batches = 0
        self.exported_spans = 0
        self.errors = 0

    # --- engine-loop side: O(1), never blocks, never raises ----------------------------
    def submit(self, item: EngineStep | FinishedRequest) -> bool:
        try:
            self._queue.put_nowait(item)
            return True
        except queue.Full:
            self.dropped += 1
            return False
        except Exception:  # pragma: no cover - defensive: telemetry never breaks vLLM
            self.errors += 1
            return False

    # --- lifecycle ------------------------------------------------------------------
    def start(self) -> AnnotationExporter:
        with self._lock:
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(
                    target=self._run, name="tokenpath-vllm-export", daemon=True
                )
                self._thread.start()
        return self

    def shutdown(self) -> None:
        """Flush what is queued, send the last step summary, stop (idempotent)."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            thread = self._thread
        if thread is not None:
            try:
                self._queue.put(_STOP, timeout=SHUTDOWN_JOIN_SECONDS)
            except queue.Full:
                self.dropped += 1
            thread.join(SHUTDOWN_JOIN_SECONDS)
        else:
            self._drain_once(block=False)
            self._flush_interval(force=True)
        try:
            self._span_exporter.shutdown()
        except Exception:
            self.errors += 1

    # --- export thread --------------------------------------------------------------
    def _run(self) -> None:
        next_flush = self._clock() + self._config.flush_interval_seconds
        while True:
            timeout = max(0.0, next_flush - self._clock())
            stop = self._drain_once(block=True, timeout=timeout)
            if stop or self._clock() >= next_flush:
                self._flush_interval(force=stop)
                next_flush = self._clock() + self._config.flush_interval_seconds
            if stop:
                return

    def _drain_once(self, block: bool, timeout: float = 0.0) -> bool:
        """Take what is queued (waiting up to ``timeout`` for the first item), export the
        finished requests among it; True when the stop marker was seen."""
        spans: list[ReadableSpan] = []
        stop = False
        try:
            item: object = self._queue.get(block=block, timeout=timeout if block else None)
        except queue.Empty:
            return False
        while True:
            if item is _STOP:
                stop = True
            else:
                try:
                    span = self._consume(item)
                except Exception:
                    self.errors += 1
                    span = None
                if span is not None:
                    spans.append(span)
                    if len(spans) >= self._config.max_batch_spans:
                        self._export(spans)
                        spans = []
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
        self._export(spans)
        return stop

    def _consume(self, item: object) -> ReadableSpan | None:
        if isinstance(item, EngineStep):
            self._window.add(item)
            return None
        if isinstance(item, FinishedRequest):
            return self._annotation_span(item)
        return None

    def _annotation_span(self, request: FinishedRequest) -> ReadableSpan | None:
        start = request.finished_unix - request.inference_seconds - STEP_MATCH_SLACK_SECONDS
        summary = self._window.summarize(start, request.finished_unix)
        attributes: dict[str, Any] = {
            **self._request_common,
            attr.GEN_AI_REQUEST_ID: request.request_id,
            attr.CACHED_TOKENS: request.cached_tokens,
            attr.PREEMPTIONS: request.preemptions,
            attr.PREFILL_NEW_TOKENS: max(0, request.prompt_tokens - request.cached_tokens),
            attr.GEN_AI_RESPONSE_FINISH_REASONS: (request.finish_reason,),
            **_summary_attributes(summary),
        }
        return self._span(attr.SPAN_REQUEST_ANNOTATION, request.finished_unix,
                          request.finished_unix, attributes,
                          parent=_request_trace(request.request_id))

    def _flush_interval(self, force: bool) -> None:
        end = self._clock()
        summary = self._window.take_interval()
        if summary is None and not (force and (self.dropped or self.failed_batches)):
            self._interval_start = end
            return
        attributes: dict[str, Any] = {
            **self._common,
            attr.EXPORT_DROPPED: self.dropped,
            attr.EXPORT_FAILED_BATCHES: self.failed_batches,
        }
        if summary is not None:
            attributes.update(_summary_attributes(summary))
        span = self._span(attr.SPAN_ENGINE_STEPS, self._interval_start, end, attributes)
        self._interval_start = end
        if span is not None:
            self._export([span])

    def _span(
        self, name: str, start_unix: float, end_unix: float, attributes: dict[str, Any],
        parent: Context | None = None,
    ) -> ReadableSpan | None:
        span = self._tracer.start_span(
            name, context=parent, kind=SpanKind.INTERNAL, attributes=attributes,
            start_time=int(start_unix * 1e9),
        )
        span.end(end_time=int(max(end_unix, start_unix) * 1e9))
        return span if isinstance(span, ReadableSpan) else None

    def _export(self, spans: Sequence[ReadableSpan]) -> None:
        if not spans:
            return
        try:
            result = self._span_exporter.export(spans)
        except Exception:
            log.debug("tokenpath vLLM plugin: export raised", exc_info=True)
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            self.exported_spans += len(spans)
        else:
            self.failed_batches += 1


def _request_trace(request_id: str) -> Context | None:
    """The request's own trace, when its gateway named it in the request id (a child of
    the gateway's span); else None, and the annotation starts a trace of its own."""
    found = trace_of(request_id)
    if found is None:
        return None
    trace_id, span_id = found
    parent = SpanContext(trace_id, span_id, is_remote=True,
                         trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return set_span_in_context(NonRecordingSpan(parent))


def _summary_attributes(summary: StepSummary) -> dict[str, Any]:
    return {
        attr.STEP_COUNT: summary.steps,
        attr.STEP_SECONDS: summary.seconds,
        attr.STEP_PREFILL_TOKENS: summary.prefill_tokens,
        attr.STEP_DECODE_TOKENS: summary.decode_tokens,
        attr.STEP_MAX_BATCH_REQUESTS: summary.max_batch_requests,
        attr.STEP_SECONDS_SOURCE: summary.seconds_source,
    }
