"""OTLP/gRPC status codes, as the OTLP specification sets them."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from testkit.support.otlp import export_request, make_span, new_trace_id, request_span
from tests.collector.conftest import ServiceFactory, wait_for
from tokenpath.collector.assembler import AssemblerConfig
from tokenpath.collector.limits import IngestLimits
from tokenpath.collector.receivers.grpc import METRICS_SERVICE, TRACE_SERVICE

RECEIVER = "otlp_grpc"


def _export(endpoint: str, body: bytes, service: str = TRACE_SERVICE,
            compression: grpc.Compression | None = None,
            metadata: tuple[tuple[str, str], ...] | None = None) -> object:
    deserializer = (ExportTraceServiceResponse.FromString if service == TRACE_SERVICE
                    else ExportMetricsServiceResponse.FromString)
    with grpc.insecure_channel(endpoint, options=[
            ("grpc.max_send_message_length", 64 << 20)]) as channel:
        call = channel.unary_unary(f"/{service}/Export", request_serializer=None,
                                   response_deserializer=deserializer)
        return call(body, timeout=10, compression=compression, metadata=metadata)


@pytest.mark.parametrize("service_name", [TRACE_SERVICE, METRICS_SERVICE])
def test_malformed_message_is_invalid_argument(make_service: ServiceFactory,
                                               service_name: str) -> None:
    service = make_service()
    assert service.grpc_endpoint is not None
    with pytest.raises(grpc.RpcError) as err:
        _export(service.grpc_endpoint, b"\xff\xff\xff\x0f garbage", service_name)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert service.stats.requests_rejected[(RECEIVER, "INVALID_ARGUMENT")] == 1


def test_empty_request_is_ok(make_service: ServiceFactory) -> None:
    service = make_service()
    assert service.grpc_endpoint is not None
    response = _export(service.grpc_endpoint, b"")
    assert isinstance(response, ExportTraceServiceResponse)
    assert not response.HasField("partial_success")


def test_shedding_load_is_unavailable_with_retry_info(make_service: ServiceFactory) -> None:
    held = AssemblerConfig(root_grace_seconds=600, idle_timeout_seconds=600)
    service = make_service(assembler=held, max_buffered_spans=1)
    assert service.grpc_endpoint is not None
    _export(service.grpc_endpoint, export_request([request_span()]).SerializeToString())
    with pytest.raises(grpc.RpcError) as err:
        _export(service.grpc_endpoint, export_request([request_span()]).SerializeToString())
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    status = rpc_status.from_call(err.value)  # type: ignore[arg-type]
    assert status is not None
    info = error_details_pb2.RetryInfo()
    assert status.details[0].Unpack(info)
    assert info.retry_delay.seconds > 0
    assert service.stats.requests_rejected[(RECEIVER, "UNAVAILABLE")] == 1


def test_partial_success(make_service: ServiceFactory) -> None:
    service = make_service(assembler=AssemblerConfig(max_spans_per_trace=1,
                                                     root_grace_seconds=0.0,
                                                     tick_seconds=0.02))
    assert service.grpc_endpoint is not None
    trace_id = new_trace_id()
    root = request_span(trace_id)
    bad = request_span()
    bad.span_id = b"\x01\x02"
    over = make_span(trace_id, parent=root.span_id)
    response = _export(service.grpc_endpoint,
                       export_request([root, bad, over]).SerializeToString())
    assert isinstance(response, ExportTraceServiceResponse)
    assert response.partial_success.rejected_spans == 2
    assert "invalid span_id" in response.partial_success.error_message
    assert "spans_per_trace" in response.partial_success.error_message
    wait_for(lambda: service.stats.records_stored.value == 1)
    late = make_span(trace_id, parent=root.span_id)
    response = _export(service.grpc_endpoint, export_request([late]).SerializeToString())
    assert isinstance(response, ExportTraceServiceResponse)
    assert response.partial_success.rejected_spans == 1
    assert "late" in response.partial_success.error_message


def test_message_over_cap_is_resource_exhausted(make_service: ServiceFactory) -> None:
    service = make_service(limits=IngestLimits(max_body_bytes=64 * 1024))
    assert service.grpc_endpoint is not None
    big = export_request([request_span(attrs={"pad": "x" * 200_000})]).SerializeToString()
    with pytest.raises(grpc.RpcError) as err:
        _export(service.grpc_endpoint, big)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
    # gzip makes it small on the wire; the cap still applies after decompression.
    bomb = export_request([request_span(attrs={"pad": "\x00" * (8 << 20)})]).SerializeToString()
    with pytest.raises(grpc.RpcError) as err:
        _export(service.grpc_endpoint, bomb, compression=grpc.Compression.Gzip)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
    assert service.stats.spans_received.total() == 0


def test_rpcs_past_the_concurrency_cap_are_refused_not_queued(
        make_service: ServiceFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from tokenpath.collector.receivers import grpc as grpc_receiver

    monkeypatch.setattr(grpc_receiver, "DEFAULT_MAX_CONCURRENT_RPCS", 2)
    service = make_service()
    assert service.grpc_endpoint is not None
    release = threading.Event()
    entered = threading.Semaphore(0)
    export = service.ingest.export_trace_payload

    def held(body: bytes, content_type: str, receiver: str) -> object:
        entered.release()
        release.wait(10)
        return export(body, content_type, receiver)

    monkeypatch.setattr(service.ingest, "export_trace_payload", held)
    body = export_request([request_span()]).SerializeToString()
    with grpc.insecure_channel(service.grpc_endpoint) as channel:
        call = channel.unary_unary(f"/{TRACE_SERVICE}/Export")
        first, second = call.future(body, timeout=10), call.future(body, timeout=10)
        assert entered.acquire(timeout=5) and entered.acquire(timeout=5)  # both running
        with pytest.raises(grpc.RpcError) as err:
            call(body, timeout=10)
        assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        release.set()
        first.result()
        second.result()
