"""A disaggregated request in the UI (real headless Chromium, a real collector fed by the
real OpenTelemetry SDK): its page names both engines and the KV transfer, and its
waterfall's GPU rows say which engine each phase ran on."""

from __future__ import annotations

import time
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from tests.collector.ui.conftest import ConsoleLog, wait_for_records
from tokenpath import attributes as A
from tokenpath.collector.service import CollectorService
from tokenpath.stages import StageId

pytestmark = pytest.mark.integration

READY = "main[data-ready='true']"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _provider(url: str, resource: dict[str, str]) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(SimpleSpanProcessor(
        OTLPSpanExporter(endpoint=f"{url}/v1/traces")))
    return provider


def _send_pd_request(url: str) -> str:
    """The gateway's server span, then the prefill engine's and the decode engine's
    llm_request spans (each from its own process: its own resource), one request id."""
    gateway = _provider(url, {"service.name": "gateway"})
    engines = {role: _provider(url, {"service.instance.id": f"{role}-0",
                                     "k8s.node.name": f"{role}-node"})
               for role in ("prefill", "decode")}
    t0 = time.time_ns() - 3_000_000_000
    sec = 1_000_000_000
    server = gateway.get_tracer("t").start_span(
        "POST /v1/completions", kind=trace.SpanKind.SERVER, start_time=t0,
        attributes={"http.route": "/v1/completions", A.GEN_AI_REQUEST_MODEL: MODEL})
    context = trace.set_span_in_context(server)
    for role, start, end, completion, queue, prefill, decode in (
            ("prefill", 0.01, 0.31, 1, 0.005, 0.28, 0.0),
            ("decode", 0.32, 2.18, 200, 0.12, 0.01, 1.72)):
        engines[role].get_tracer("vllm").start_span(
            A.VLLM_REQUEST_SPAN_NAME, context=context, kind=trace.SpanKind.SERVER,
            start_time=t0 + int(start * sec), attributes={
                A.GEN_AI_REQUEST_MODEL: MODEL, A.GEN_AI_REQUEST_ID: "cmpl-pd-ui",
                A.VLLM_USAGE_PROMPT_TOKENS: 4000, A.VLLM_USAGE_COMPLETION_TOKENS: completion,
                A.VLLM_LATENCY_TIME_IN_QUEUE: queue,
                A.VLLM_LATENCY_TIME_IN_MODEL_PREFILL: prefill,
                A.VLLM_LATENCY_TIME_IN_MODEL_DECODE: decode}).end(t0 + int(end * sec))
    server.end(t0 + int(2.2 * sec))
    for provider in (*engines.values(), gateway):
        provider.shutdown()
    return format(server.get_span_context().trace_id, "032x")


def test_a_disaggregated_request_names_both_engines_in_its_waterfall(
        collector: CollectorService, page: tuple[Any, ConsoleLog]) -> None:
    browser_page, _ = page
    url = collector.http_url
    trace_id = _send_pd_request(url)
    records = wait_for_records(url, 1)
    assert [r["decode_engine_id"] for r in records] == ["decode-0"]
    browser_page.goto(f"{url}/#/requests/{trace_id}")
    browser_page.wait_for_selector("table.waterfall")
    browser_page.wait_for_selector(READY)
    card = browser_page.text_content("#disaggregated") or ""
    assert "Prefill on prefill-0 (node prefill-node)" in card
    assert "decode on decode-0 (node decode-node)" in card
    assert "3,999 tokens (derived)" in card
    hbm = browser_page.text_content(
        f"tr[data-stage='{StageId.HBM_LOAD.value}'] td.sub") or ""
    assert "decode (decode-0)" in hbm
    kernel = browser_page.text_content(
        f"tr[data-stage='{StageId.KERNEL_EXEC.value}'] td.sub") or ""
    assert "prefill (prefill-0)" in kernel
    nic = browser_page.text_content(f"tr[data-stage='{StageId.NIC_TX.value}'] td.sub") or ""
    assert "kv_transfer" in nic
