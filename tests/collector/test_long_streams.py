"""Long streams with the stock FastAPI/ASGI instrumentation: one sub-span per response
chunk is folded on ingest (a count and the first body send), never the reason a request
disappears; at the per-trace cap important spans replace expendable ones."""

from __future__ import annotations

import asyncio

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from testkit.fakes.spans import new_trace_id, span
from tests.collector.cost.helpers import RecordingSink
from tokenpath import attributes as A
from tokenpath.collector.assembler import Assembler, AssemblerConfig
from tokenpath.collector.limits import IngestLimits
from tokenpath.collector.mapping import StageMapper
from tokenpath.collector.receivers.otlp_decode import decode_traces
from tokenpath.collector.spans import SPAN_KIND_SERVER, SpanData
from tokenpath.collector.stats import CollectorStats

CHUNKS = 1_500


def _stream_spans() -> list[SpanData]:
    """A real FastAPI app streaming CHUNKS chunks under the real instrumentation, its
    spans converted as the collector's decoder would hold them."""
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse
    from starlette.testclient import TestClient

    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat() -> StreamingResponse:
        async def chunks():  # type: ignore[no-untyped-def]
            for i in range(CHUNKS):
                yield f"data: {i}\n\n"
                await asyncio.sleep(0)
        return StreamingResponse(chunks(), media_type="text/event-stream")

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    FastAPIInstrumentor.instrument_app(app, tracer_provider=provider)
    with TestClient(app) as client:
        assert client.post("/v1/chat/completions").status_code == 200
    request = encode_spans(memory.get_finished_spans())  # the real OTLP encoding
    return decode_traces(request, IngestLimits()).spans


def test_a_1500_chunk_stream_is_one_request_with_its_chunks_and_ttft() -> None:
    spans = _stream_spans()
    assert len(spans) > CHUNKS  # one sub-span per chunk, as the instrumentation makes them
    stats = CollectorStats()
    sink = RecordingSink()
    assembler = Assembler(StageMapper(sink, stats), AssemblerConfig(), stats)
    for start in range(0, len(spans), 512):  # exported in batches, the server span last
        assembler.consume_spans(spans[start:start + 512])
    assembler.shutdown()
    (record,) = sink.records
    # every body send, Starlette's closing empty one included
    assert CHUNKS <= record.response_chunks <= CHUNKS + 1
    assert record.ttft_seconds is not None and record.ttft_seconds < record.duration_seconds
    assert stats.spans_summarised["asgi_message"] == len(spans) - 1
    assert stats.spans_dropped["spans_per_trace"] == 0


def test_at_the_cap_the_server_span_replaces_an_expendable_one() -> None:
    tid = new_trace_id()
    cap = 10
    stats = CollectorStats()
    sink = RecordingSink()
    assembler = Assembler(StageMapper(sink, stats), AssemblerConfig(max_spans_per_trace=cap),
                          stats)
    server = span(tid, "POST /v1/chat/completions", kind=SPAN_KIND_SERVER, start=0.0, end=2.0,
                  attributes={"http.route": "/v1/chat/completions",
                              A.GEN_AI_REQUEST_MODEL: "m"})
    filler = [span(tid, f"db query {i}", parent=server.span_id, start=0.1, end=0.2)
              for i in range(cap + 5)]
    assembler.consume_spans(filler)
    assembler.consume_spans([server])  # it ends last, arrives last
    assembler.shutdown()
    (record,) = sink.records
    assert record.model == "m"
    assert stats.spans_dropped["spans_per_trace"] == 5 + 1
