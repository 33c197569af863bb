"""TokenpathOTLPSpanExporter over real HTTP on loopback: the same request bodies as the
stock OTLP/HTTP exporter, its failures answered as the stock exporter answers them, and a
fallback to the stock encoder (counted) where tokenpath's encoder fails; and
TokenpathBatchSpanProcessor, which queues spans encoded as they end."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from testkit.fakes.otlp_http import OtlpHttpReceiver
from tests.instrumentation.reference.support import send, serving, workload_requests
from tokenpath import attributes as attr
from tokenpath.instrumentation import otlp_exporter
from tokenpath.instrumentation.otlp_encoder import EncodedSpan, encode_span
from tokenpath.instrumentation.otlp_exporter import (
    TokenpathBatchSpanProcessor,
    TokenpathOTLPSpanExporter,
)
from tokenpath.instrumentation.safety import sdk_version_fallbacks, telemetry_errors
from tokenpath.instrumentation.sdk_compat import (
    EXPORTER_IN_TESTED_RANGE,
    TESTED_MAX,
    installed_version,
)


def _fast_encoding() -> tuple[bool, bool]:
    """Whether the installed exporter takes tokenpath's encoding, and its batch processor
    queues spans encoded (the exporter's and the SDK's internals as they are now)."""
    exporter = TokenpathOTLPSpanExporter(endpoint="http://127.0.0.1:9/v1/traces")
    processor = TokenpathBatchSpanProcessor(exporter)
    try:
        return exporter.fast_encoding, processor.encodes_at_end
    finally:
        processor.shutdown()


FAST_ENCODING, ENCODES_AT_END = _fast_encoding()
needs_fast_encoding = pytest.mark.skipif(
    not FAST_ENCODING, reason="this exporter version takes the stock encoding")
needs_encoding_at_end = pytest.mark.skipif(
    not ENCODES_AT_END, reason="this SDK version's batch processor is the stock one")


@pytest.fixture
def receiver() -> Iterator[OtlpHttpReceiver]:
    made = OtlpHttpReceiver()
    yield made
    made.close()


@pytest.fixture(scope="module")
def spans() -> list[ReadableSpan]:
    """Real spans of the reference serving path (gateway shim and engines)."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "exporter-test"}),
                              shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with serving(provider) as path:
        send(path, provider, workload_requests(6, stream_share=0.5))
    return list(memory.get_finished_spans())


@pytest.mark.parametrize("compression", [None, Compression.Gzip])
def test_request_bodies_equal_the_stock_exporters(
    receiver: OtlpHttpReceiver, spans: list[ReadableSpan], compression: Compression | None,
) -> None:
    stock = OTLPSpanExporter(endpoint=receiver.url, compression=compression)
    ours = TokenpathOTLPSpanExporter(endpoint=receiver.url, compression=compression)
    assert stock.export(spans) is SpanExportResult.SUCCESS
    assert ours.export(spans) is SpanExportResult.SUCCESS
    assert len(receiver.bodies) == 2
    assert receiver.bodies[0] == receiver.bodies[1]
    decoded = ExportTraceServiceRequest.FromString(receiver.bodies[1])
    assert sum(len(s.spans) for r in decoded.resource_spans for s in r.scope_spans) == len(spans)
    stock.shutdown()
    ours.shutdown()


def test_a_refused_batch_is_a_failure_not_an_exception(
    receiver: OtlpHttpReceiver, spans: list[ReadableSpan],
) -> None:
    receiver.status = 400  # not retryable
    exporter = TokenpathOTLPSpanExporter(endpoint=receiver.url)
    assert exporter.export(spans) is SpanExportResult.FAILURE
    assert len(receiver.bodies) == 1


def test_the_newest_tested_versions_take_the_fast_encoding() -> None:
    """Inside the tested range the fast paths run where the internals are there (the
    newest tested version has them all); outside it never."""
    version = installed_version("opentelemetry-exporter-otlp-proto-http")
    if not EXPORTER_IN_TESTED_RANGE:
        assert not FAST_ENCODING and not ENCODES_AT_END
    elif version == ".".join(map(str, TESTED_MAX)):
        assert FAST_ENCODING and ENCODES_AT_END
    else:
        pytest.skip(f"exporter {version}: the fast encoding as its internals allow")


def test_outside_the_tested_versions_exports_are_the_stock_ones_counted(
    receiver: OtlpHttpReceiver, spans: list[ReadableSpan],
) -> None:
    if EXPORTER_IN_TESTED_RANGE:
        pytest.skip("the installed versions are tested: the fast paths run")
    before = sdk_version_fallbacks.by_place().get("otlp_exporter.export", 0)
    exporter = TokenpathOTLPSpanExporter(endpoint=receiver.url)
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    assert sdk_version_fallbacks.by_place()["otlp_exporter.export"] == before + 1


@needs_fast_encoding
def test_a_batch_over_the_size_limit_is_dropped_unsent(
    receiver: OtlpHttpReceiver, spans: list[ReadableSpan],
) -> None:
    exporter = TokenpathOTLPSpanExporter(endpoint=receiver.url, max_request_size=64)
    assert exporter.export(spans) is SpanExportResult.FAILURE
    assert receiver.bodies == []
    assert exporter.export(spans[:0]) is SpanExportResult.SUCCESS  # an empty request fits


def test_after_shutdown_batches_are_refused(receiver: OtlpHttpReceiver,
                                            spans: list[ReadableSpan]) -> None:
    exporter = TokenpathOTLPSpanExporter(endpoint=receiver.url)
    exporter.shutdown()
    assert exporter.export(spans) is SpanExportResult.FAILURE
    assert receiver.bodies == []


@needs_fast_encoding
def test_an_encoder_failure_falls_back_to_the_stock_encoding_and_is_counted(
    receiver: OtlpHttpReceiver, spans: list[ReadableSpan], monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(batch: object) -> bytes:
        raise RuntimeError("encoder bug")

    monkeypatch.setattr(otlp_exporter, "encode_export_request", broken)
    before = telemetry_errors.by_place().get("otlp_exporter.encode", 0)
    exporter = TokenpathOTLPSpanExporter(endpoint=receiver.url)
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    assert telemetry_errors.by_place()["otlp_exporter.encode"] == before + 1
    assert OTLPSpanExporter(endpoint=receiver.url).export(spans) is SpanExportResult.SUCCESS
    assert receiver.bodies[0] == receiver.bodies[1]


def test_an_exporter_without_the_internals_uses_the_stock_export(
    receiver: OtlpHttpReceiver, spans: list[ReadableSpan], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(otlp_exporter, "_REQUIRED_INTERNALS", ("_not_there",))
    exporter = TokenpathOTLPSpanExporter(endpoint=receiver.url)
    assert not exporter.fast_encoding
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    assert len(receiver.bodies) == 1


def _traced_with(processor: SpanProcessor, count: int) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": "bsp-test"}),
                              shutdown_on_exit=False)
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("test")
    for index in range(count):
        with tracer.start_as_current_span(f"request {index % 3}") as span:
            span.set_attribute("index", index)
            span.add_event(attr.STAGE_EVENT, {attr.STAGE: "router", attr.STAGE_SECONDS: 0.5})
    return provider


def _spans_received(receiver: OtlpHttpReceiver) -> list[int]:
    out = []
    for body in receiver.bodies:
        for resource_spans in ExportTraceServiceRequest.FromString(body).resource_spans:
            for scope_spans in resource_spans.scope_spans:
                out += [span.attributes[0].value.int_value for span in scope_spans.spans]
    return sorted(out)


@needs_encoding_at_end
def test_the_batch_processor_queues_encoded_spans_and_exports_them_all(
    receiver: OtlpHttpReceiver,
) -> None:
    exporter = TokenpathOTLPSpanExporter(endpoint=receiver.url)
    processor = TokenpathBatchSpanProcessor(exporter, max_export_batch_size=16)
    assert processor.encodes_at_end
    queued: list[object] = []
    queue = processor._tokenpath_queue
    emit = queue.emit
    queue.emit = lambda item: (queued.append(type(item)), emit(item))
    provider = _traced_with(processor, 40)
    provider.shutdown()  # flushes
    assert set(queued) == {EncodedSpan}
    assert _spans_received(receiver) == list(range(40))
    assert len(receiver.bodies) >= 3  # batches of at most 16


def test_the_batch_processor_in_front_of_another_exporter_is_the_stock_one() -> None:
    memory = InMemorySpanExporter()
    processor = TokenpathBatchSpanProcessor(memory)
    assert not processor.encodes_at_end
    _traced_with(processor, 5).shutdown()
    assert sorted(s.attributes["index"] for s in memory.get_finished_spans()) == list(range(5))


@needs_encoding_at_end
def test_a_span_the_processor_cannot_encode_is_queued_as_it_is_and_still_exported(
    receiver: OtlpHttpReceiver, monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = otlp_exporter.encode_span
    calls = []

    def sometimes_broken(span: ReadableSpan) -> EncodedSpan:
        calls.append(span)
        if len(calls) % 2:
            raise RuntimeError("encoder bug")
        return real(span)

    monkeypatch.setattr(otlp_exporter, "encode_span", sometimes_broken)
    before = telemetry_errors.by_place().get("otlp_exporter.encode_span", 0)
    processor = TokenpathBatchSpanProcessor(TokenpathOTLPSpanExporter(endpoint=receiver.url))
    _traced_with(processor, 10).shutdown()
    assert telemetry_errors.by_place()["otlp_exporter.encode_span"] == before + 5
    assert _spans_received(receiver) == list(range(10))


@needs_fast_encoding
def test_a_mixed_batch_falls_back_to_the_stock_encoder_for_its_raw_spans(
    receiver: OtlpHttpReceiver, spans: list[ReadableSpan], monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = otlp_exporter.encode_export_request

    def fails_on_raw_spans(batch: list[object]) -> bytes:
        if not all(isinstance(item, EncodedSpan) for item in batch):
            raise RuntimeError("encoder bug")
        return real(batch)  # type: ignore[arg-type]

    monkeypatch.setattr(otlp_exporter, "encode_export_request", fails_on_raw_spans)
    mixed = [encode_span(s) if i % 2 else s for i, s in enumerate(spans)]
    exporter = TokenpathOTLPSpanExporter(endpoint=receiver.url)
    assert exporter.export(mixed) is SpanExportResult.SUCCESS  # type: ignore[arg-type]
    decoded = ExportTraceServiceRequest.FromString(receiver.bodies[0])
    got = sorted(s.span_id for r in decoded.resource_spans for ss in r.scope_spans
                 for s in ss.spans)
    assert got == sorted(s.context.span_id.to_bytes(8, "big") for s in spans)
