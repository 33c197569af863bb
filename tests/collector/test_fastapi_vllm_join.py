"""No tokenpath code in the path: a gateway instrumented with the real
opentelemetry-instrumentation-fastapi calls an engine that emits vLLM's `llm_request`
span (vLLM's attribute names, context from `traceparent`). The collector joins them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from opentelemetry import trace as otel_trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.propagate import extract, inject
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from testkit.support.processes import collector_process, poll_records, run_cli_json
from tokenpath import attributes as A
from tokenpath.collector.http_app import HttpListener
from tokenpath.stages import StageId

pytestmark = pytest.mark.integration

QUEUE, PREFILL, DECODE = 0.004, 0.012, 0.03


def engine_app(provider: TracerProvider) -> FastAPI:
    """What vLLM does: one SERVER span per request, parented by the incoming traceparent."""
    app = FastAPI()
    tracer = provider.get_tracer("vllm.engine")
    counter = {"n": 0}

    @app.post("/v1/completions")
    async def complete(request: Request) -> dict[str, Any]:
        body = await request.json()
        counter["n"] += 1
        prompt_tokens = len(body["prompt"].split())
        completion_tokens = body["max_tokens"]
        arrival = time.time_ns()
        time.sleep(QUEUE + PREFILL + DECODE)
        ctx = extract(dict(request.headers))
        with tracer.start_as_current_span(A.VLLM_REQUEST_SPAN_NAME, context=ctx,
                                          kind=otel_trace.SpanKind.SERVER,
                                          start_time=arrival) as span:
            span.set_attribute(A.GEN_AI_REQUEST_MODEL, "tiny-llama")
            span.set_attribute(A.GEN_AI_REQUEST_ID, f"cmpl-{counter['n']}")
            span.set_attribute(A.VLLM_USAGE_PROMPT_TOKENS, prompt_tokens)
            span.set_attribute(A.VLLM_USAGE_COMPLETION_TOKENS, completion_tokens)
            span.set_attribute(A.VLLM_LATENCY_TIME_IN_QUEUE, QUEUE)
            span.set_attribute(A.VLLM_LATENCY_TIME_TO_FIRST_TOKEN, QUEUE + PREFILL)
            span.set_attribute(A.VLLM_LATENCY_TIME_IN_MODEL_PREFILL, PREFILL)
            span.set_attribute(A.VLLM_LATENCY_TIME_IN_MODEL_DECODE, DECODE)
            span.set_attribute(A.VLLM_LATENCY_E2E, QUEUE + PREFILL + DECODE)
        return {"usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}}

    return app


def gateway_app(engine_url: str, provider: TracerProvider) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/completions")
    async def proxy(request: Request) -> Any:
        headers: dict[str, str] = {}
        inject(headers)  # traceparent of the FastAPI server span
        async with httpx.AsyncClient() as client:
            upstream = await client.post(f"{engine_url}/v1/completions",
                                         json=await request.json(), headers=headers)
        return upstream.json()

    FastAPIInstrumentor.instrument_app(app, tracer_provider=provider)
    return app


def test_fastapi_gateway_and_vllm_span_join(tmp_path: Path) -> None:
    with collector_process(tmp_path / "store.db") as collector:
        engine_provider = TracerProvider(resource=Resource.create({"service.name": "vllm"}))
        engine_provider.add_span_processor(
            BatchSpanProcessor(GrpcExporter(endpoint=collector.grpc_endpoint, insecure=True)))
        gateway_provider = TracerProvider(resource=Resource.create({"service.name": "gateway"}))
        gateway_provider.add_span_processor(
            BatchSpanProcessor(HttpExporter(endpoint=f"{collector.http_url}/v1/traces")))
        engine = HttpListener(engine_app(engine_provider), "127.0.0.1", 0)
        engine.start()
        gateway = HttpListener(gateway_app(engine.url, gateway_provider), "127.0.0.1", 0)
        gateway.start()
        sent = []
        try:
            for i in range(6):
                prompt = "shared system prompt " * (i + 1)
                response = httpx.post(f"{gateway.url}/v1/completions", timeout=10,
                                      json={"prompt": prompt, "max_tokens": 4 + i})
                assert response.status_code == 200
                sent.append(response.json()["usage"])
            engine_provider.force_flush()
            gateway_provider.force_flush()
            poll_records(collector.http_url, len(sent))
            time.sleep(1.5)  # one more grace period: nothing else may arrive as a request
            records = run_cli_json("requests", "--collector", collector.http_url)
        finally:
            gateway.shutdown()
            engine.shutdown()
            engine_provider.shutdown()
            gateway_provider.shutdown()

    assert len(records) == len(sent)
    assert sorted(r["input_tokens"] for r in records) == sorted(u["prompt_tokens"] for u in sent)
    assert sorted(r["output_tokens"] for r in records) == sorted(
        u["completion_tokens"] for u in sent)
    for record in records:
        assert record["complete"] is True
        assert record["model"] == "tiny-llama"
        assert record["ttft_seconds"] == pytest.approx(QUEUE + PREFILL)
        assert record["stages"][StageId.SCHEDULER_QUEUE.value]["seconds"] == pytest.approx(QUEUE)
        gateway_stage = record["stages"][StageId.API_GATEWAY.value]
        assert gateway_stage["provenance"] == "derived"
        assert gateway_stage["seconds"] >= 0
        assert record["span_count"] >= 2  # the FastAPI server span and llm_request
