"""Engine hooks: what a scheduler, KV cache and step loop measure about one request.

An engine creates one :class:`EngineRequestTrace` per request at arrival and calls it
from its scheduler (``scheduled``), KV cache (``kv_lookup``) and step loop (``step``,
``first_token``); ``finish`` emits one vLLM-compatible ``llm_request`` span carrying
vLLM's attribute names plus tokenpath's, with the stages the engine measures itself
(scheduler_queue, kv_cache_lookup, gpu_dispatch per phase) as ``STAGE_EVENT`` events.
The GPU stages 8 to 10 are left to the collector, which splits the in-model time.

Per-step calls only add to a few floats; the span is created once, at finish, with
the arrival time as its start. Every call is guarded: telemetry never raises.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tokenpath import attributes as attr
from tokenpath.instrumentation.safety import telemetry_errors
from tokenpath.instrumentation.stage_recorder import StageRecorder
from tokenpath.stages import Phase, StageId

INSTRUMENTATION_NAME = "tokenpath.instrumentation"
_PROPAGATOR = TraceContextTextMapPropagator()


def parent_context(trace_headers: Mapping[str, Any] | None) -> otel_context.Context:
    """The caller's trace context from its headers, matched in any case (``Traceparent``
    from a case-preserving header map) and read from ``str`` or ``bytes`` values. Without
    one, an empty context: the span starts a trace of its own rather than joining
    whatever span is current where it ends. Never raises: a failure is counted."""
    if not trace_headers:
        return otel_context.Context()
    try:
        carrier = {
            str(key).lower(): value.decode("latin-1") if isinstance(value, bytes) else value
            for key, value in trace_headers.items()
        }
        return _PROPAGATOR.extract(carrier=carrier)
    except Exception as exc:
        telemetry_errors.count("engine_trace.trace_headers", exc)
        return otel_context.Context()


def get_tracer(tracer_provider: TracerProvider | None = None) -> Tracer:
    return trace.get_tracer(INSTRUMENTATION_NAME, tracer_provider=tracer_provider)


@dataclass(frozen=True, slots=True)
class EngineIdentity:
    """Where an engine runs; copied onto every engine span."""

    model: str
    engine: str
    replica: str
    node: str
    pool: str
    gpu_type: str
    tensor_parallel: int = 1
    simulated: bool = False
    role: str | None = None  # disaggregated serving: "prefill" or "decode"

    def span_attributes(self) -> dict[str, Any]:
        out = {
            attr.GEN_AI_REQUEST_MODEL: self.model,
            attr.ENGINE: self.engine,
            attr.ENGINE_REPLICA: self.replica,
            attr.NODE: self.node,
            attr.POOL: self.pool,
            attr.GPU_TYPE: self.gpu_type,
            attr.TENSOR_PARALLEL: self.tensor_parallel,
            attr.SIMULATED: self.simulated,
        }
        if self.role is not None:  # one process may run both: each names its own GPUs
            out[attr.ENGINE_ROLE] = self.role
            out[attr.ENGINE_ID] = self.replica
        return out


@dataclass(slots=True)
class _PhaseTotals:
    dispatch_seconds: float = 0.0
    steps: int = 0
    step_seconds: float = 0.0


@dataclass(slots=True)
class EngineRequestTrace:
    """Timings of one request inside an engine. Times are ``time.time()`` seconds."""

    tracer: Tracer
    identity: EngineIdentity
    request_id: str
    prompt_tokens: int
    max_tokens: int
    trace_headers: Mapping[str, Any] | None = None
    arrival: float = field(default_factory=time.time)
    scheduled_at: float | None = None
    first_token_at: float | None = None
    cached_tokens: int = 0
    kv_lookup_seconds: float = 0.0
    fingerprints: Sequence[str] = ()
    fingerprint_block_tokens: int = 0
    preemptions: int = 0
    _phases: dict[Phase, _PhaseTotals] = field(default_factory=dict)
    _trace_id_hex: str | None = None

    def scheduled(self, now: float) -> None:
        """First time the scheduler put the request into a step (end of scheduler_queue)."""
        if self.scheduled_at is None:
            self.scheduled_at = now

    def kv_lookup(
        self, seconds: float, cached_tokens: int, fingerprints: Sequence[str] = (),
        block_tokens: int = 0,
    ) -> None:
        self.kv_lookup_seconds += seconds
        self.cached_tokens = cached_tokens
        if fingerprints:
            self.fingerprints = fingerprints
            self.fingerprint_block_tokens = block_tokens

    def step(self, phase: Phase, step_seconds: float, dispatch_seconds: float) -> None:
        """The request took part in one engine step in ``phase``."""
        totals = self._phases.get(phase)
        if totals is None:
            totals = self._phases[phase] = _PhaseTotals()
        totals.steps += 1
        totals.step_seconds += step_seconds
        totals.dispatch_seconds += dispatch_seconds

    def first_token(self, now: float) -> None:
        if self.first_token_at is None:
            self.first_token_at = now

    def preempted(self) -> None:
        self.preemptions += 1

    @property
    def trace_id(self) -> str | None:
        """The 32-hex trace id the engine span will carry (from ``trace_headers``)."""
        if self._trace_id_hex is None and self.trace_headers:
            ctx = trace.get_current_span(parent_context(self.trace_headers)).get_span_context()
            if ctx.is_valid:
                self._trace_id_hex = format(ctx.trace_id, "032x")
        return self._trace_id_hex

    def finish(
        self, now: float, output_tokens: int, finish_reason: str = "length", error: bool = False
    ) -> str | None:
        """Emit the ``llm_request`` span; returns its trace id (32 hex). Never raises."""
        try:
            return self._emit(now, output_tokens, finish_reason, error)
        except Exception as exc:
            telemetry_errors.count("engine_trace.finish", exc)
            return None

    def _emit(self, now: float, output_tokens: int, finish_reason: str, error: bool) -> str | None:
        parent = parent_context(self.trace_headers)
        scheduled = self.scheduled_at if self.scheduled_at is not None else now
        first = self.first_token_at if self.first_token_at is not None else now
        queue = max(0.0, scheduled - self.arrival)
        prefill = max(0.0, first - scheduled)
        decode = max(0.0, now - first)
        attributes = self.identity.span_attributes()
        attributes.update({
            attr.GEN_AI_REQUEST_ID: self.request_id,
            attr.GEN_AI_REQUEST_MAX_TOKENS: self.max_tokens,
            attr.GEN_AI_RESPONSE_FINISH_REASONS: [finish_reason],
            attr.VLLM_USAGE_PROMPT_TOKENS: self.prompt_tokens,
            attr.VLLM_USAGE_COMPLETION_TOKENS: output_tokens,
            attr.VLLM_USAGE_NUM_SEQUENCES: 1,
            attr.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: self.cached_tokens,
            attr.PREFILL_NEW_TOKENS: max(0, self.prompt_tokens - self.cached_tokens),
            attr.VLLM_LATENCY_TIME_IN_QUEUE: queue,
            attr.VLLM_LATENCY_TIME_TO_FIRST_TOKEN: max(0.0, first - self.arrival),
            attr.VLLM_LATENCY_E2E: max(0.0, now - self.arrival),
            attr.VLLM_LATENCY_TIME_IN_MODEL_PREFILL: prefill,
            attr.VLLM_LATENCY_TIME_IN_MODEL_DECODE: decode,
            attr.STEP_COUNT: sum(t.steps for t in self._phases.values()),
        })
        if self.preemptions:
            attributes[attr.PREEMPTIONS] = self.preemptions
        if error:
            attributes[attr.STATUS] = "error"
        if self.fingerprints:
            attributes[attr.PREFIX_FINGERPRINTS] = list(self.fingerprints)
            attributes[attr.PREFIX_BLOCK_TOKENS] = self.fingerprint_block_tokens
        span = self.tracer.start_span(
            attr.VLLM_REQUEST_SPAN_NAME,
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            start_time=int(self.arrival * 1e9),
        )
        try:
            recorder = StageRecorder(span)
            recorder.record(StageId.SCHEDULER_QUEUE, queue, end_ns=int(scheduled * 1e9))
            recorder.record(StageId.KV_CACHE_LOOKUP, self.kv_lookup_seconds,
                            end_ns=int(scheduled * 1e9))
            for phase, totals in self._phases.items():
                if totals.dispatch_seconds > 0:
                    end = first if phase is Phase.PREFILL else now
                    recorder.record(StageId.GPU_DISPATCH, totals.dispatch_seconds, phase=phase,
                                    end_ns=int(end * 1e9))
            recorder.flush()
            if error:
                span.set_status(Status(StatusCode.ERROR))
        except Exception as exc:
            telemetry_errors.count("engine_trace.events", exc)
        finally:
            span.end(end_time=int(now * 1e9))
        context = span.get_span_context()
        return format(context.trace_id, "032x") if context.is_valid else self.trace_id
