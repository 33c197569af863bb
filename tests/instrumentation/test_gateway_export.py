"""The gateway shim's SERVER span as it leaves the process: through tokenpath's batch
processor and OTLP/HTTP exporter (as docs/instrumentation.md sets a gateway up), over
loopback, decoded from the request body. The shim makes its span with the public
OpenTelemetry API; these pin what that span carries."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status as ProtoStatus
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from testkit.fakes.otlp_http import OtlpHttpReceiver
from tests.instrumentation.reference.support import run_async
from tokenpath import attributes as attr
from tokenpath.instrumentation.gateway import (
    TokenpathGatewayMiddleware,
    annotate,
    gateway_stage,
    mark_engine_handoff,
    trace_headers,
)
from tokenpath.instrumentation.otlp_exporter import (
    TokenpathBatchSpanProcessor,
    TokenpathOTLPSpanExporter,
)
from tokenpath.stages import StageId

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
GATEWAY_STAGES = {"auth_ratelimit", "router", "api_gateway", "response_path", "switch_hop",
                  "nic_tx", "ethernet_serialize"}
END_ATTRIBUTES = {attr.HTTP_RESPONSE_STATUS_CODE, attr.STATUS, attr.RESPONSE_BYTES,
                  attr.RESPONSE_CHUNKS, attr.RESPONSE_PACKETS, attr.RESPONSE_SMALL_CHUNKS,
                  attr.RESPONSE_WRITE_SECONDS, attr.LINK_BITS_PER_SECOND}


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpHttpReceiver]:
    made = OtlpHttpReceiver()
    yield made
    made.close()


@pytest.fixture
def provider(receiver: OtlpHttpReceiver) -> Iterator[TracerProvider]:
    made = TracerProvider(resource=Resource.create({"service.name": "gateway-export-test"}),
                          shutdown_on_exit=False)
    made.add_span_processor(TokenpathBatchSpanProcessor(
        TokenpathOTLPSpanExporter(endpoint=receiver.url), schedule_delay_millis=60_000))
    yield made
    made.shutdown()


def _request(provider: TracerProvider, receiver: OtlpHttpReceiver, status: int = 200,
             app_calls: bool = False) -> ProtoSpan:
    """One streamed request through the shim (with a ``traceparent``); the span exported."""

    async def app(scope: object, receive: object, send: Any) -> None:
        with gateway_stage(StageId.AUTH_RATELIMIT):
            pass
        with gateway_stage(StageId.ROUTER):
            pass
        mark_engine_handoff()
        assert trace_headers()["traceparent"].split("-")[1] == TRACEPARENT.split("-")[1]
        if app_calls:  # what an app may do to the gateway's span while the request runs
            annotate("app.annotated", 7)
            span = trace.get_current_span()
            span.set_attribute("app.tier", "gold")
            span.add_event("app.event", {"app.k": "v"})
        await send({"type": "http.response.start", "status": status, "headers": []})
        for _ in range(3):
            await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, object]) -> None:
        pass

    middleware = TokenpathGatewayMiddleware(app, provider)
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
             "headers": [(b"traceparent", TRACEPARENT.encode())]}
    before = len(receiver.bodies)
    run_async(lambda: middleware(scope, receive, send))
    assert provider.force_flush(10_000)
    (body,) = receiver.bodies[before:]
    request = ExportTraceServiceRequest.FromString(body)
    (resource_spans,) = request.resource_spans
    (scope_spans,) = resource_spans.scope_spans
    (span,) = scope_spans.spans
    return span


def _attributes(span: ProtoSpan) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind) if kind else None
    return out


def test_the_gateway_span_is_exported_with_its_attributes_and_stage_events(
    provider: TracerProvider, receiver: OtlpHttpReceiver,
) -> None:
    span = _request(provider, receiver)
    assert span.name == "POST /v1/chat/completions"
    assert span.kind == ProtoSpan.SpanKind.SPAN_KIND_SERVER
    assert span.trace_id.hex() == TRACEPARENT.split("-")[1]
    assert span.parent_span_id.hex() == TRACEPARENT.split("-")[2]
    assert span.status.code == ProtoStatus.StatusCode.STATUS_CODE_UNSET
    attributes = _attributes(span)
    assert attributes[attr.HTTP_REQUEST_METHOD] == "POST"
    assert attributes[attr.URL_PATH] == "/v1/chat/completions"
    assert set(attributes) == {attr.HTTP_REQUEST_METHOD, attr.URL_PATH, attr.TTFT_SECONDS,
                               *END_ATTRIBUTES}
    assert attributes[attr.HTTP_RESPONSE_STATUS_CODE] == 200
    assert attributes[attr.STATUS] == "ok"
    assert attributes[attr.RESPONSE_BYTES] == 3 * len(b"data: {}\n\n")
    assert attributes[attr.RESPONSE_CHUNKS] == 3
    assert attributes[attr.TTFT_SECONDS] >= 0.0
    assert [event.name for event in span.events] == [attr.STAGE_EVENT] * len(GATEWAY_STAGES)
    stages = {_attributes_of(event)[attr.STAGE] for event in span.events}
    assert stages == GATEWAY_STAGES
    assert all(event.time_unix_nano > 0 for event in span.events)
    assert span.dropped_attributes_count == span.dropped_events_count == 0


def _attributes_of(event: Any) -> dict[str, Any]:
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in event.attributes}


def test_app_calls_on_the_span_are_exported_with_the_shims_writes(
    provider: TracerProvider, receiver: OtlpHttpReceiver,
) -> None:
    span = _request(provider, receiver, app_calls=True)
    attributes = _attributes(span)
    assert attributes["app.tier"] == "gold"
    assert attributes["app.annotated"] == 7
    assert set(attributes) >= END_ATTRIBUTES
    names = [event.name for event in span.events]
    assert names[0] == "app.event"  # the app's event, then the shim's at the end
    assert names[1:] == [attr.STAGE_EVENT] * len(GATEWAY_STAGES)


def test_a_server_error_is_an_error_status_without_ttft(
    provider: TracerProvider, receiver: OtlpHttpReceiver,
) -> None:
    span = _request(provider, receiver, status=503)
    assert span.status.code == ProtoStatus.StatusCode.STATUS_CODE_ERROR
    attributes = _attributes(span)
    assert attributes[attr.STATUS] == "error"
    assert attributes[attr.HTTP_RESPONSE_STATUS_CODE] == 503
    assert attr.TTFT_SECONDS not in attributes
