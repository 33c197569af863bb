"""OTLP/HTTP status codes and bodies, as the OTLP specification sets them."""

from __future__ import annotations

import gzip
import json

import httpx
import pytest
from google.protobuf import json_format
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from testkit.support.otlp import (
    JSON_HEADERS,
    PROTOBUF_HEADERS,
    export_request,
    make_span,
    new_span_id,
    new_trace_id,
    request_span,
    sample,
    to_otlp_json,
    to_otlp_json_dict,
)
from tests.collector.conftest import ServiceFactory, wait_for
from tokenpath import metric_names as M
from tokenpath.collector.assembler import AssemblerConfig
from tokenpath.collector.limits import IngestLimits

RECEIVER = "otlp_http"


def _post(url: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{url}/v1/traces", content=body, headers=headers, timeout=10)


def _status(response: httpx.Response) -> status_pb2.Status:
    status = status_pb2.Status()
    if response.headers["content-type"].startswith("application/json"):
        json_format.Parse(response.text, status)
    else:
        status.ParseFromString(response.content)
    return status


def _rejected(url: str, status: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return sample(text, M.REQUESTS_REJECTED.series, receiver=RECEIVER, status=status)


@pytest.mark.parametrize(("body", "headers"), [
    (b"\xff\xff\xff\x0f garbage", PROTOBUF_HEADERS),
    (b"{not json", JSON_HEADERS),
    (b"[1, 2]", JSON_HEADERS),
    (b'{"resourceSpans": "not a list"}', JSON_HEADERS),
    (b'{"resourceSpans": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", JSON_HEADERS),
    (b'{"a":' * 3000 + b"1" + b"}" * 3000, JSON_HEADERS),
    (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "\\ud800"}]}]}]}',
     JSON_HEADERS),
])
def test_malformed_payload_is_400_with_status_in_request_encoding(
        make_service: ServiceFactory, body: bytes, headers: dict[str, str]) -> None:
    service = make_service()
    response = _post(service.http_url, body, headers)
    assert response.status_code == 400
    assert response.headers["content-type"].startswith(headers["Content-Type"])
    status = _status(response)
    assert status.code == code_pb2.INVALID_ARGUMENT
    assert status.message
    assert _rejected(service.http_url, "400") == 1


def test_unknown_content_type_is_415(make_service: ServiceFactory) -> None:
    service = make_service()
    body = export_request([request_span()]).SerializeToString()
    response = _post(service.http_url, body, {"Content-Type": "text/plain"})
    assert response.status_code == 415
    assert _status(response).code == code_pb2.INVALID_ARGUMENT
    unknown_encoding = _post(service.http_url, body,
                             {**PROTOBUF_HEADERS, "Content-Encoding": "br"})
    assert unknown_encoding.status_code == 415
    assert _rejected(service.http_url, "415") == 2


def test_wrong_method_is_405_with_a_status(make_service: ServiceFactory) -> None:
    service = make_service()
    for path in ("/v1/traces", "/v1/metrics", "/v1/logs"):
        for method in ("GET", "PUT", "DELETE"):
            response = httpx.request(method, f"{service.http_url}{path}", timeout=5)
            assert response.status_code == 405
            assert "POST" in response.headers["allow"]
            status = status_pb2.Status.FromString(response.content)
            assert status.code == code_pb2.UNIMPLEMENTED and "POST" in status.message
    as_json = httpx.get(f"{service.http_url}/v1/traces", headers=JSON_HEADERS, timeout=5)
    assert json.loads(as_json.text)["code"] == code_pb2.UNIMPLEMENTED
    # elsewhere the API keeps FastAPI's JSON errors
    api = httpx.post(f"{service.http_url}/api/requests", timeout=5)
    assert api.status_code == 405 and "detail" in api.json()


def test_zstd_bodies_are_read_and_bad_ones_refused(make_service: ServiceFactory) -> None:
    import zstandard

    service = make_service()
    body = export_request([request_span()]).SerializeToString()
    packed = zstandard.ZstdCompressor().compress(body)
    ok = _post(service.http_url, packed, {**PROTOBUF_HEADERS, "Content-Encoding": "zstd"})
    assert ok.status_code == 200
    wait_for(lambda: service.store.count() == 1)
    for bad in (packed[: len(packed) // 2], packed + b"trailing", b"not zstd"):
        refused = _post(service.http_url, bad, {**PROTOBUF_HEADERS, "Content-Encoding": "zstd"})
        assert refused.status_code == 400
        assert status_pb2.Status.FromString(refused.content).code == code_pb2.INVALID_ARGUMENT


def test_body_over_cap_is_413_on_the_wire(make_service: ServiceFactory) -> None:
    service = make_service(limits=IngestLimits(max_body_bytes=4096))
    big = export_request([request_span(attrs={"pad": "x" * 8000})]).SerializeToString()
    response = _post(service.http_url, big, PROTOBUF_HEADERS)  # Content-Length declared
    assert response.status_code == 413
    assert _status(response).code == code_pb2.RESOURCE_EXHAUSTED

    def chunks() -> object:  # no Content-Length: the cap applies while streaming
        for i in range(0, len(big), 1000):
            yield big[i:i + 1000]

    streamed = httpx.post(f"{service.http_url}/v1/traces", content=chunks(),  # type: ignore[arg-type]
                          headers=PROTOBUF_HEADERS, timeout=10)
    assert streamed.status_code == 413
    assert _rejected(service.http_url, "413") == 2
    assert service.stats.spans_received.total() == 0


def test_gzip_bomb_is_413_after_decompression(make_service: ServiceFactory) -> None:
    service = make_service(limits=IngestLimits(max_body_bytes=64 * 1024,
                                               max_decompressed_bytes=1024 * 1024))
    bomb = gzip.compress(b"\x00" * (50 * 1024 * 1024))
    assert len(bomb) < 64 * 1024  # small on the wire
    response = _post(service.http_url, bomb, {**PROTOBUF_HEADERS, "Content-Encoding": "gzip"})
    assert response.status_code == 413
    assert "decompressed" in _status(response).message
    # A gzip body within the caps is accepted.
    ok = gzip.compress(export_request([request_span()]).SerializeToString())
    accepted = _post(service.http_url, ok, {**PROTOBUF_HEADERS, "Content-Encoding": "gzip"})
    assert accepted.status_code == 200
    corrupt = _post(service.http_url, b"\x1f\x8b not gzip",
                    {**PROTOBUF_HEADERS, "Content-Encoding": "gzip"})
    assert corrupt.status_code == 400
    # Two gzip members (RFC 1952): both are read; protobuf concatenation merges them.
    two = [request_span(), request_span()]
    members = b"".join(gzip.compress(export_request([s]).SerializeToString()) for s in two)
    received = service.stats.spans_received.total()
    both = _post(service.http_url, members, {**PROTOBUF_HEADERS, "Content-Encoding": "gzip"})
    assert both.status_code == 200
    assert service.stats.spans_received.total() - received == 2


def test_shedding_load_is_429_with_retry_after(make_service: ServiceFactory) -> None:
    held = AssemblerConfig(root_grace_seconds=600, idle_timeout_seconds=600)
    service = make_service(assembler=held, max_buffered_spans=2)
    first = _post(service.http_url,
                  export_request([request_span(), request_span()]).SerializeToString(),
                  PROTOBUF_HEADERS)
    assert first.status_code == 200
    for body, headers in (
        (export_request([request_span()]).SerializeToString(), PROTOBUF_HEADERS),
        (to_otlp_json(export_request([request_span()])), JSON_HEADERS),
    ):
        shed = _post(service.http_url, body, headers)
        assert shed.status_code == 429
        assert int(shed.headers["retry-after"]) > 0
        status = _status(shed)
        assert status.code == code_pb2.UNAVAILABLE
        info = error_details_pb2.RetryInfo()
        assert status.details[0].Unpack(info)
        assert info.retry_delay.seconds == int(shed.headers["retry-after"])
    assert _rejected(service.http_url, "429") == 2


def _response(response: httpx.Response) -> ExportTraceServiceResponse:
    assert response.status_code == 200
    message = ExportTraceServiceResponse()
    if response.headers["content-type"].startswith("application/json"):
        json_format.Parse(response.text, message)
    else:
        message.ParseFromString(response.content)
    return message


def test_partial_success_for_bad_id_lengths(make_service: ServiceFactory) -> None:
    service = make_service()
    good = request_span()
    bad_trace = request_span()
    bad_trace.trace_id = b"\x01" * 15
    bad_span = request_span()
    bad_span.span_id = b"\x02" * 9
    zero_trace = request_span()
    zero_trace.trace_id = b"\x00" * 16
    body = export_request([good, bad_trace, bad_span, zero_trace])
    result = _response(_post(service.http_url, body.SerializeToString(), PROTOBUF_HEADERS))
    assert result.partial_success.rejected_spans == 3
    assert "invalid trace_id" in result.partial_success.error_message
    assert "invalid span_id" in result.partial_success.error_message
    # The same over OTLP/JSON, where ids are hex: a wrong-length or non-hex id.
    doc = to_otlp_json_dict(export_request([request_span(), request_span(), request_span()]))
    spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    spans[1]["traceId"] = "abcd"
    spans[2]["spanId"] = "not-hex!"
    result = _response(_post(service.http_url, json.dumps(doc).encode(), JSON_HEADERS))
    assert result.partial_success.rejected_spans == 2
    wait_for(lambda: service.stats.records_stored.value == 2)
    text = httpx.get(f"{service.http_url}/metrics", timeout=5).text
    assert sample(text, M.SPANS_REJECTED.series, receiver=RECEIVER,
                  reason="invalid trace_id") == 3
    assert sample(text, M.SPANS_REJECTED.series, receiver=RECEIVER,
                  reason="invalid span_id") == 2


def test_partial_success_for_spans_over_limits(make_service: ServiceFactory) -> None:
    service = make_service(assembler=AssemblerConfig(max_spans_per_trace=2,
                                                     root_grace_seconds=600))
    trace_id = new_trace_id()
    root = request_span(trace_id)
    children = [make_span(trace_id, parent=root.span_id) for _ in range(3)]
    result = _response(_post(service.http_url,
                             export_request([root, *children]).SerializeToString(),
                             PROTOBUF_HEADERS))
    assert result.partial_success.rejected_spans == 2
    assert "spans_per_trace" in result.partial_success.error_message


def test_limits_on_accepted_spans_are_a_warning(make_service: ServiceFactory) -> None:
    service = make_service(limits=IngestLimits(max_attributes_per_span=3))
    span = request_span(attrs={f"extra.{i}": i for i in range(5)})
    result = _response(_post(service.http_url, export_request([span]).SerializeToString(),
                             PROTOBUF_HEADERS))
    assert result.partial_success.rejected_spans == 0
    assert "attributes per span" in result.partial_success.error_message


@pytest.mark.parametrize(("body", "headers"), [
    (b"", PROTOBUF_HEADERS),
    (ExportTraceServiceRequest().SerializeToString(), PROTOBUF_HEADERS),
    (b"", JSON_HEADERS),
    (b"{}", JSON_HEADERS),
    (b'{"resourceSpans": []}', JSON_HEADERS),
])
def test_empty_request_is_200(make_service: ServiceFactory, body: bytes,
                              headers: dict[str, str]) -> None:
    service = make_service()
    result = _response(_post(service.http_url, body, headers))
    assert not result.HasField("partial_success")


def test_json_hex_ids_and_unknown_fields(make_service: ServiceFactory) -> None:
    service = make_service()
    trace_id, span_id = new_trace_id(), new_span_id()
    doc = to_otlp_json_dict(export_request([request_span(trace_id, span_id=span_id)]))
    span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert span["traceId"] == trace_id.hex()  # hex on the wire, not base64
    span["traceId"] = trace_id.hex().upper()  # hex ids are case-insensitive
    doc["someFutureField"] = {"nested": [1, 2]}
    span["anotherUnknownField"] = "ignored"
    doc["resourceSpans"][0]["scopeSpans"][0]["scope"] = {"name": "x", "newThing": 1}
    response = _post(service.http_url, json.dumps(doc).encode(),
                     {"Content-Type": "application/json; charset=utf-8"})
    assert response.headers["content-type"].startswith("application/json")
    assert not _response(response).HasField("partial_success")
    wait_for(lambda: service.store.record(trace_id.hex()) is not None)
    got = httpx.get(f"{service.http_url}/api/requests/{trace_id.hex()}", timeout=5).json()
    assert got["trace_id"] == trace_id.hex()


def test_zstd_bomb_is_413_after_decompression(make_service: ServiceFactory) -> None:
    import zstandard

    service = make_service(limits=IngestLimits(max_decompressed_bytes=1 << 20))
    bomb = zstandard.ZstdCompressor(level=19).compress(b"\0" * (64 << 20))
    assert len(bomb) < 16_384  # a few KiB on the wire
    response = _post(service.http_url, bomb, {**PROTOBUF_HEADERS, "Content-Encoding": "zstd"})
    assert response.status_code == 413
