"""A small, fixed OTLP trace export of vLLM-shaped requests: what a plain deployment sends
with no tokenpath code in it (an ASGI gateway's SERVER span and vLLM's own
``llm_request`` span as its child, each from its own process).

The install check (:mod:`tokenpath.install_selfcheck`) runs it through the decoder and
the compiled core, and the installed-package tests send it to an installed collector.
Its numbers are made up; nothing in it is content.
"""

from __future__ import annotations

import random
from typing import Final

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from tokenpath import attributes as A
from tokenpath.otlp_values import key_value

SAMPLE_MODEL: Final = "llama-3.1-8b"
SAMPLE_ENGINE_INSTANCE: Final = "sample-vllm-0"


def _resource_spans(resource: dict[str, str], scope: str, spans: list[Span]) -> ResourceSpans:
    out = ResourceSpans(resource=Resource(
        attributes=[key_value(k, v) for k, v in resource.items()]))
    scoped = ScopeSpans(spans=spans)
    scoped.scope.name = scope
    out.scope_spans.append(scoped)
    return out


def sample_export(now_unix: float, requests: int = 8, seed: int = 7) -> ExportTraceServiceRequest:
    """``requests`` gateway + vLLM request pairs, all ended shortly before ``now_unix``,
    overlapping on one engine."""
    rng = random.Random(seed)
    # Whole nanoseconds from a whole second: every send of the sample has the same
    # durations to the nanosecond, whatever ``now_unix`` is.
    base = (int(now_unix) - 5) * 1_000_000_000
    gateway_spans: list[Span] = []
    engine_spans: list[Span] = []
    for index in range(requests):
        trace_id = rng.getrandbits(128).to_bytes(16, "big")
        gateway_id = rng.getrandbits(64).to_bytes(8, "big")
        arrival = base + index * 50_000_000
        queue, prefill = 2_000_000, 20_000_000 + 2_000_000 * index
        decode = 150_000_000 + 10_000_000 * index
        prompt, completion = 600 + 40 * index, 48 + 4 * index
        end = arrival + queue + prefill + decode
        gateway_spans.append(Span(
            trace_id=trace_id, span_id=gateway_id, name="POST /v1/chat/completions",
            kind=Span.SPAN_KIND_SERVER, start_time_unix_nano=arrival - 3_000_000,
            end_time_unix_nano=end + 2_000_000,
            attributes=[key_value(A.HTTP_REQUEST_METHOD, "POST"),
                        key_value(A.HTTP_ROUTE, "/v1/chat/completions"),
                        key_value(A.HTTP_RESPONSE_STATUS_CODE, 200)]))
        engine_spans.append(Span(
            trace_id=trace_id, span_id=rng.getrandbits(64).to_bytes(8, "big"),
            parent_span_id=gateway_id, name=A.VLLM_REQUEST_SPAN_NAME,
            kind=Span.SPAN_KIND_SERVER, start_time_unix_nano=arrival,
            end_time_unix_nano=end,
            attributes=[
                key_value(A.GEN_AI_REQUEST_MODEL, SAMPLE_MODEL),
                key_value(A.GEN_AI_REQUEST_ID, f"cmpl-sample-{index}"),
                key_value(A.VLLM_USAGE_PROMPT_TOKENS, prompt),
                key_value(A.VLLM_USAGE_COMPLETION_TOKENS, completion),
                key_value(A.VLLM_LATENCY_TIME_IN_QUEUE, queue / 1e9),
                key_value(A.VLLM_LATENCY_TIME_TO_FIRST_TOKEN, (queue + prefill) / 1e9),
                key_value(A.VLLM_LATENCY_E2E, (queue + prefill + decode) / 1e9),
                key_value(A.VLLM_LATENCY_TIME_IN_MODEL_PREFILL, prefill / 1e9),
                key_value(A.VLLM_LATENCY_TIME_IN_MODEL_DECODE, decode / 1e9),
            ]))
    export = ExportTraceServiceRequest()
    export.resource_spans.append(_resource_spans(
        {A.SERVICE_NAME: "gateway", A.HOST_NAME: "sample-gateway-host"}, "gateway", gateway_spans))
    export.resource_spans.append(_resource_spans(
        {A.SERVICE_NAME: "vllm", A.SERVICE_INSTANCE_ID: SAMPLE_ENGINE_INSTANCE},
        "vllm.tracing", engine_spans))
    return export
