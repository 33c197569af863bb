"""AnnotationExporter: bounded hand-off, annotation and step-summary spans, counted drops."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext

from tokenpath import attributes as attr
from tokenpath.instrumentation.request_ids import request_id_for, trace_of
from tokenpath.instrumentation.vllm.config import PluginConfig
from tokenpath.instrumentation.vllm.exporter import (
    AnnotationExporter,
    EngineStep,
    FinishedRequest,
)


def finished(request_id: str, at: float, cached: int = 32,
             inference: float = 0.5) -> FinishedRequest:
    return FinishedRequest(
        request_id=request_id, finished_unix=at, cached_tokens=cached, preemptions=1,
        prompt_tokens=100, generation_tokens=8, inference_seconds=inference,
        finish_reason="length",
    )


def by_name(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def test_finished_request_becomes_annotation_span_with_step_summary() -> None:
    sink = InMemorySpanExporter()
    exporter = AnnotationExporter(PluginConfig(node="n1", pool="p1"), sink, clock=lambda: 100.0)
    exporter.submit(EngineStep(99.0, 0, 4, 4, None))  # before the request started
    exporter.submit(EngineStep(99.6, 90, 0, 1, 0.02))
    exporter.submit(EngineStep(99.8, 0, 3, 3, 0.01))
    exporter.submit(finished("cmpl-abc-0", at=100.0))
    exporter.shutdown()

    (span,) = by_name(sink.get_finished_spans(), attr.SPAN_REQUEST_ANNOTATION)
    a = span.attributes or {}
    assert a[attr.GEN_AI_REQUEST_ID] == "cmpl-abc-0"
    assert a[attr.CACHED_TOKENS] == 32
    assert a[attr.PREEMPTIONS] == 1
    assert a[attr.PREFILL_NEW_TOKENS] == 68
    assert a[attr.ENGINE] == "vllm"
    assert a[attr.NODE] == "n1" and a[attr.POOL] == "p1"
    assert a[attr.STEP_COUNT] == 2
    assert a[attr.STEP_PREFILL_TOKENS] == 90
    assert a[attr.STEP_DECODE_TOKENS] == 3
    assert a[attr.STEP_MAX_BATCH_REQUESTS] == 3
    assert abs(float(a[attr.STEP_SECONDS]) - 0.03) < 1e-9  # type: ignore[arg-type]
    assert a[attr.STEP_SECONDS_SOURCE] == "measured"
    assert tuple(a[attr.GEN_AI_RESPONSE_FINISH_REASONS]) == ("length",)  # type: ignore[arg-type]


def test_an_annotation_joins_the_trace_its_request_id_names() -> None:
    sink = InMemorySpanExporter()
    exporter = AnnotationExporter(PluginConfig(), sink, clock=lambda: 100.0)
    gateway = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331,
                          is_remote=True)
    named = request_id_for(gateway)
    assert named is not None
    exporter.submit(finished(f"chatcmpl-{named}", at=100.0))  # as vLLM wraps the header
    exporter.submit(finished("chatcmpl-4f1c9e0a7b2d4c6e8f0a1b2c3d4e5f60", at=100.0))
    exporter.shutdown()
    joined, alone = by_name(sink.get_finished_spans(), attr.SPAN_REQUEST_ANNOTATION)
    assert joined.context is not None and joined.parent is not None
    assert joined.context.trace_id == gateway.trace_id
    assert joined.parent.span_id == gateway.span_id
    assert alone.context is not None and alone.parent is None  # a trace of its own
    assert alone.context.trace_id != gateway.trace_id


def test_request_ids_round_trip_and_refuse_what_names_no_trace() -> None:
    context = SpanContext(1, 2, is_remote=False)
    named = request_id_for(context)
    assert named == "tp-" + "0" * 31 + "1-" + "0" * 15 + "2"
    assert trace_of(f"cmpl-{named}-0-ab12") == (1, 2)
    assert request_id_for(SpanContext(0, 0, is_remote=False)) is None
    for other in ("cmpl-abc-0", "tp-" + "0" * 32 + "-" + "0" * 16, "tp-XYZ"):
        assert trace_of(other) is None


def test_interval_summary_span_counts_all_steps_and_drops() -> None:
    sink = InMemorySpanExporter()
    exporter = AnnotationExporter(PluginConfig(queue_size=2), sink, clock=lambda: 50.0)
    assert exporter.submit(EngineStep(10.0, 5, 0, 1, None))
    assert exporter.submit(EngineStep(10.5, 0, 2, 2, None))
    assert not exporter.submit(EngineStep(11.0, 0, 2, 2, None))  # queue full, not started
    assert exporter.dropped == 1
    exporter.shutdown()

    (span,) = by_name(sink.get_finished_spans(), attr.SPAN_ENGINE_STEPS)
    a = span.attributes or {}
    assert a[attr.STEP_COUNT] == 2
    assert a[attr.STEP_PREFILL_TOKENS] == 5
    assert a[attr.STEP_DECODE_TOKENS] == 2
    assert a[attr.STEP_SECONDS] == 0.5  # derived from the timestamp gap
    assert a[attr.STEP_SECONDS_SOURCE] == "derived"
    assert a[attr.EXPORT_DROPPED] == 1


def test_export_thread_delivers_and_shutdown_is_idempotent() -> None:
    sink = InMemorySpanExporter()
    exporter = AnnotationExporter(PluginConfig(flush_interval_seconds=0.05), sink).start()
    for n in range(20):
        exporter.submit(finished(f"r{n}", at=1000.0 + n))
    exporter.shutdown()
    exporter.shutdown()
    ids = {s.attributes[attr.GEN_AI_REQUEST_ID]  # type: ignore[index]
           for s in by_name(sink.get_finished_spans(), attr.SPAN_REQUEST_ANNOTATION)}
    assert ids == {f"r{n}" for n in range(20)}
    assert exporter.exported_spans == 20


class FailingExporter(InMemorySpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        raise ConnectionError("collector down")


def test_failing_span_exporter_is_counted_not_raised() -> None:
    exporter = AnnotationExporter(PluginConfig(), FailingExporter())
    exporter.submit(finished("r1", at=5.0))
    exporter.shutdown()
    # the annotation batch, then the final health summary that reports the failure
    assert exporter.failed_batches == 2
    assert exporter.exported_spans == 0


def test_request_annotations_name_the_engines_served_model() -> None:
    sink = InMemorySpanExporter()
    exporter = AnnotationExporter(PluginConfig(), sink, clock=lambda: 100.0,
                                  served_model_name="tiny-llama")
    exporter.submit(finished("chatcmpl-1", at=100.0))
    exporter.shutdown()
    (span,) = by_name(sink.get_finished_spans(), attr.SPAN_REQUEST_ANNOTATION)
    assert (span.attributes or {})[attr.GEN_AI_RESPONSE_MODEL] == "tiny-llama"
    steps = by_name(sink.get_finished_spans(), attr.SPAN_ENGINE_STEPS)
    assert all(attr.GEN_AI_RESPONSE_MODEL not in (s.attributes or {}) for s in steps)


def test_the_served_model_name_is_read_from_vllms_config_duck_typed() -> None:
    from types import SimpleNamespace

    from tokenpath.instrumentation.vllm.exporter import served_model_name

    def config(name: object) -> object:
        return SimpleNamespace(model_config=SimpleNamespace(served_model_name=name))

    assert served_model_name(config("tiny-llama")) == "tiny-llama"
    assert served_model_name(config(["a", "b"])) == "a"  # vLLM's metrics label the first
    assert served_model_name(config(None)) is None
    assert served_model_name(config("")) is None
    assert served_model_name(object()) is None
