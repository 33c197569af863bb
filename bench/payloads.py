"""Realistic OTLP payloads for the ingest benchmarks: 15-stage traces, 100 spans a request."""

from __future__ import annotations

import os
import random

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from tokenpath import attributes as A
from tokenpath.otlp_values import key_value
from tokenpath.stages import STAGES, Phase

SPANS_PER_REQUEST = 100


# Payload shapes the whole-collector bench is fed with: 15-stage traces of
# separate spans with 6 attributes each, and the reference serving path's own traces.
SHAPE_STAGE_SPANS = "stage_spans"
SHAPE_REFERENCE_PATH = "reference_path"
SHAPES = (SHAPE_STAGE_SPANS, SHAPE_REFERENCE_PATH)


def _trace(rng: random.Random, t0: int) -> list[Span]:
    """One request: a root span with request facts and one span per stage (6 attributes
    each: stage, phase, provenance and three a gateway's instrumentation adds)."""
    trace_id = os.urandom(16)
    root_id = os.urandom(8)
    spans = [
        Span(
            trace_id=trace_id, span_id=root_id, name="POST /v1/chat/completions", kind=2,
            start_time_unix_nano=t0, end_time_unix_nano=t0 + 900_000_000,
            attributes=[
                key_value(A.GEN_AI_REQUEST_MODEL, "llama-3.1-8b"),
                key_value(A.GEN_AI_USAGE_INPUT_TOKENS, rng.randint(100, 4000)),
                key_value(A.GEN_AI_USAGE_OUTPUT_TOKENS, rng.randint(10, 400)),
                key_value(A.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, rng.randint(0, 90)),
                key_value(A.TTFT_SECONDS, rng.uniform(0.05, 0.5)),
                key_value(A.NODE, "gpu-node-07"),
                key_value(A.POOL, "h100-pool"),
                key_value(A.PREFIX_FINGERPRINTS, [os.urandom(8).hex() for _ in range(4)]),
                key_value("http.route", "/v1/chat/completions"),
                key_value("http.request.method", "POST"),
            ],
        )
    ]
    for stage in STAGES:
        phase = Phase.PREFILL if stage.order % 2 else Phase.DECODE
        spans.append(Span(
            trace_id=trace_id, span_id=os.urandom(8), parent_span_id=root_id,
            name=f"tokenpath.stage.{stage.id.value}", kind=1,
            start_time_unix_nano=t0 + stage.order * 1000,
            end_time_unix_nano=t0 + stage.order * 1000 + rng.randint(1000, 50_000_000),
            attributes=[key_value(A.STAGE, stage.id.value), key_value(A.PHASE, phase.value),
                        key_value(A.PROVENANCE, "measured"), key_value("thread.id", 1234),
                        key_value("code.function", "handle"),
                        key_value("service.version", "1.4.2")],
        ))
    return spans


def make_requests(export_requests: int, spans_per_request: int = SPANS_PER_REQUEST,
                  seed: int = 1) -> list[bytes]:
    """Serialized ExportTraceServiceRequests, each holding ``spans_per_request`` spans."""
    rng = random.Random(seed)
    out = []
    t0 = 1_700_000_000_000_000_000
    for _ in range(export_requests):
        spans: list[Span] = []
        while len(spans) < spans_per_request:
            spans.extend(_trace(rng, t0))
            t0 += 1_000_000
        message = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
            resource=Resource(attributes=[key_value("service.name", "gateway"),
                                          key_value("host.name", "gpu-node-07")]),
            scope_spans=[ScopeSpans(spans=spans[:spans_per_request])],
        )])
        out.append(message.SerializeToString())
    return out


def _read_value(value: AnyValue) -> int:
    """Read one attribute value of any kind (arrays and maps element by element)."""
    which = value.WhichOneof("value")
    if which == "string_value":
        return len(value.string_value)
    if which == "int_value":
        return value.int_value
    if which == "double_value":
        return int(value.double_value)
    if which == "bool_value":
        return int(value.bool_value)
    if which == "bytes_value":
        return len(value.bytes_value)
    if which == "array_value":
        return sum(_read_value(item) for item in value.array_value.values)
    if which == "kvlist_value":
        return sum(len(kv.key) + _read_value(kv.value) for kv in value.kvlist_value.values)
    return 0


def parse_floor(payloads: list[bytes]) -> int:
    """The floor: parse each payload and read every field in Python, span events' and
    links' attributes included (docs/performance.md), the common value kinds inline as a
    tuned reader would. Returns spans read."""
    n = 0
    sink = 0
    for body in payloads:
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        for rs in message.resource_spans:
            resource = rs.resource
            sink += len(rs.schema_url) + resource.dropped_attributes_count
            sink += sum(len(kv.key) + _read_value(kv.value) for kv in resource.attributes)
            for ss in rs.scope_spans:
                scope = ss.scope
                sink += len(scope.name) + len(scope.version) + len(ss.schema_url)
                sink += sum(len(kv.key) + _read_value(kv.value) for kv in scope.attributes)
                for span in ss.spans:
                    n += 1
                    sink += len(span.trace_id) + len(span.span_id) + len(span.parent_span_id)
                    sink += len(span.trace_state) + span.flags + len(span.name) + span.kind
                    sink += span.start_time_unix_nano + span.end_time_unix_nano
                    sink += span.dropped_attributes_count + span.dropped_events_count
                    sink += span.dropped_links_count
                    status = span.status
                    sink += status.code + len(status.message)
                    for kv in span.attributes:
                        v = kv.value
                        sink += len(kv.key)
                        which = v.WhichOneof("value")
                        if which == "string_value":
                            sink += len(v.string_value)
                        elif which == "int_value":
                            sink += v.int_value
                        else:
                            sink += _read_value(v)
                    for ev in span.events:
                        sink += len(ev.name) + ev.time_unix_nano + ev.dropped_attributes_count
                        for kv in ev.attributes:
                            v = kv.value
                            sink += len(kv.key)
                            which = v.WhichOneof("value")
                            if which == "string_value":
                                sink += len(v.string_value)
                            elif which == "double_value":
                                sink += int(v.double_value)
                            else:
                                sink += _read_value(v)
                    for link in span.links:
                        sink += len(link.trace_id) + len(link.span_id) + len(link.trace_state)
                        sink += link.flags + link.dropped_attributes_count
                        sink += sum(len(kv.key) + _read_value(kv.value) for kv in link.attributes)
    return n


def reference_path_requests(requests: int, spans_per_request: int = SPANS_PER_REQUEST,
                            concurrency: int = 16) -> list[bytes]:
    """The reference serving path's own traces (instrumented client, gateway shim, router,
    simulated engines: what tokenpath's shims send), captured from the real OpenTelemetry
    SDK while ``requests`` requests run, encoded as OTLP export requests of
    ``spans_per_request`` spans (the order the SDK finished them in)."""
    import asyncio

    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tokenpath.instrumentation.client import InstrumentedClient
    from tokenpath.instrumentation.reference.driver import drive
    from tokenpath.instrumentation.reference.engine import EngineConfig
    from tokenpath.instrumentation.reference.serving_path import (
        ReferencePathConfig,
        ReferenceServingPath,
    )
    from tokenpath.instrumentation.reference.tokenizer import ToyTokenizer
    from tokenpath.instrumentation.reference.workload import WorkloadConfig, WorkloadGenerator

    captured = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(captured))
    model = "llama-3.1-8b"
    path = ReferenceServingPath(ReferencePathConfig(
        engine=EngineConfig(model=model, time_scale=0.01)), tracer_provider=provider)
    path.start()
    workload = WorkloadGenerator(WorkloadConfig(seed=7))

    async def serve() -> None:
        client = InstrumentedClient(path.base_url, tracer_provider=provider,
                                    tokenize=ToyTokenizer().encode)
        try:  # arrivals far faster than served: the in-flight cap sets the pace
            await drive(client, workload, model, rps=10_000.0, requests=requests,
                        max_in_flight=concurrency)
        finally:
            await client.aclose()

    try:
        asyncio.run(serve())
    finally:
        path.shutdown()
        provider.shutdown()
    spans = list(captured.get_finished_spans())
    return [encode_spans(spans[i:i + spans_per_request]).SerializeToString()
            for i in range(0, len(spans), spans_per_request)]
