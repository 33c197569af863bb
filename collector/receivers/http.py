"""OTLP/HTTP receiver routes: POST /v1/traces, /v1/metrics and /v1/logs (forwarded
request records, collector/record_logs.py), protobuf or JSON, gzip.

Status codes follow the OTLP/HTTP spec: 200 with an Export*ServiceResponse (partial
success when spans were refused), 400 with a google.rpc.Status body for malformed data,
413 past the body cap (on the wire and after decompression), 415 for other content types
or encodings (identity, gzip and zstd are read), 429 with Retry-After when shedding load;
405 (a google.rpc.Status too) comes from the app's handler for the router's refusal.
"""

from __future__ import annotations

import zlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import zstandard
from fastapi import APIRouter, Request
from fastapi.responses import Response
from google.protobuf import any_pb2, duration_pb2, json_format
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from tokenpath.collector.receivers.ingest import OtlpIngest, Overloaded, partial_success
from tokenpath.collector.receivers.otlp_decode import (
    MalformedPayload,
    parse_logs_request,
    parse_metrics_request,
)
from tokenpath.collector.stats import CollectorStats

PROTOBUF = "application/x-protobuf"
# Members one gzip body may hold (exporters send one; RFC 1952 allows more).
MAX_GZIP_MEMBERS = 64
JSON = "application/json"
RECEIVER = "otlp_http"
# Frames one zstd body may hold, and the compressed bytes fed per step (at most ~8 MiB
# of output each: zstd's densest block is a few bytes for 128 KiB).
MAX_ZSTD_FRAMES = 64
ZSTD_FEED_BYTES = 256


class _BodyError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _content_kind(request: Request) -> str | None:
    value = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if value == PROTOBUF:
        return "protobuf"
    if value == JSON:
        return "json"
    return None


async def _read_body(request: Request, max_wire: int, max_decompressed: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > max_wire:
                raise _BodyError(413, f"body over {max_wire} bytes")
        except ValueError as exc:
            raise _BodyError(400, "invalid Content-Length") from exc
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_wire:
            raise _BodyError(413, f"body over {max_wire} bytes")
        chunks.append(chunk)
    body = b"".join(chunks)
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding == "gzip":
        return gunzip(body, max_decompressed)
    if encoding == "zstd":
        return unzstd(body, max_decompressed)
    raise _BodyError(415, f"unsupported Content-Encoding {encoding!r}")


def unzstd(body: bytes, max_decompressed: int) -> bytes:
    """A zstd body decompressed, every frame of it (at most MAX_ZSTD_FRAMES), at most
    ``max_decompressed`` bytes (else 413). A corrupt stream, a frame cut short or bytes
    after the last frame that are not another frame are a 400: nothing of it is taken.
    The compressed input is fed in small pieces and the output checked after each, so a
    bomb (zstd expands a few bytes into a 128 KiB block) is refused before it is held."""
    decompressor = zstandard.ZstdDecompressor()
    out: list[bytes] = []
    size = 0
    rest = body
    for _ in range(MAX_ZSTD_FRAMES):
        frame = decompressor.decompressobj()
        pos = 0
        try:
            while not frame.eof and pos < len(rest):
                chunk = frame.decompress(rest[pos:pos + ZSTD_FEED_BYTES])
                pos += ZSTD_FEED_BYTES
                size += len(chunk)
                if size > max_decompressed:
                    raise _BodyError(413, f"decompressed body over {max_decompressed} bytes")
                out.append(chunk)
        except zstandard.ZstdError as exc:
            raise _BodyError(400, f"invalid zstd body: {exc}") from exc
        if not frame.eof:
            raise _BodyError(400, "invalid zstd body: truncated (no end of frame)")
        rest = frame.unused_data + rest[pos:]
        if not rest:
            return b"".join(out)
    raise _BodyError(400, f"invalid zstd body: more than {MAX_ZSTD_FRAMES} frames")


def gunzip(body: bytes, max_decompressed: int) -> bytes:
    """A gzip body inflated, every member of it (RFC 1952 allows several, as
    ``gzip.decompress`` reads them), at most ``max_decompressed`` bytes (else 413). A
    stream that is corrupt, cut short (no end of stream, no CRC) or followed by bytes
    that are not another member is a 400: nothing of it is taken. So is a body of more
    than MAX_GZIP_MEMBERS members: each member copies the rest of the body (zlib's
    ``unused_data``), so thousands of tiny ones would hold the event loop for minutes."""
    out: list[bytes] = []
    size = 0
    rest = body
    for _ in range(MAX_GZIP_MEMBERS):
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            chunk = inflater.decompress(rest, max_decompressed - size + 1)
        except zlib.error as exc:
            raise _BodyError(400, f"invalid gzip body: {exc}") from exc
        size += len(chunk)
        if size > max_decompressed or inflater.unconsumed_tail:
            raise _BodyError(413, f"decompressed body over {max_decompressed} bytes")
        if not inflater.eof:
            raise _BodyError(400, "invalid gzip body: truncated (no end of stream)")
        out.append(chunk)
        rest = inflater.unused_data.lstrip(b"\x00")  # zero padding, as gzip itself skips
        if not rest:
            return b"".join(out)
    raise _BodyError(400, f"invalid gzip body: more than {MAX_GZIP_MEMBERS} members")


def _status_response(http_status: int, code: int, message: str, kind: str | None,
                     headers: dict[str, str] | None = None,
                     retry_after: int | None = None) -> Response:
    """An error answer: a google.rpc.Status in the request's encoding (protobuf default)."""
    status = status_pb2.Status(code=code, message=message)
    if retry_after is not None:
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.RetryInfo(
            retry_delay=duration_pb2.Duration(seconds=retry_after)))
        status.details.append(detail)
    if kind == "json":
        return Response(json_format.MessageToJson(status), http_status, headers,
                        media_type=JSON)
    return Response(status.SerializeToString(), http_status, headers, media_type=PROTOBUF)


def _ok_response(message: Any, kind: str) -> Response:
    if kind == "json":
        return Response(json_format.MessageToJson(message), 200, media_type=JSON)
    return Response(message.SerializeToString(), 200, media_type=PROTOBUF)


_HTTP_TO_RPC = {400: code_pb2.INVALID_ARGUMENT, 413: code_pb2.RESOURCE_EXHAUSTED,
                415: code_pb2.INVALID_ARGUMENT}


TRACES_PATH = "/v1/traces"
METRICS_PATH = "/v1/metrics"
LOGS_PATH = "/v1/logs"
OTLP_PATHS = frozenset({TRACES_PATH, METRICS_PATH, LOGS_PATH})


def method_not_allowed(request: Request, allow: str | None) -> Response | None:
    """The 405 of an OTLP path as the spec has it: a google.rpc.Status body (in the
    request's encoding, protobuf by default) and the Allow header. None elsewhere."""
    if request.url.path not in OTLP_PATHS:
        return None
    headers = {"Allow": allow} if allow else None
    return _status_response(405, code_pb2.UNIMPLEMENTED,
                            f"{request.method} is not allowed on {request.url.path}; use POST",
                            _content_kind(request), headers)


Endpoint = Callable[[Request], Awaitable[Response]]


def otlp_endpoints(ingest: OtlpIngest, stats: CollectorStats) -> dict[str, Endpoint]:
    """The POST handler of each OTLP path (OTLP_PATHS)."""
    limits = ingest.limits

    async def handle(request: Request, export: Callable[[bytes, str], Any],
                     admit: Callable[[], None] | None = None) -> Response:
        kind = _content_kind(request)
        if kind is None:
            stats.requests_rejected.inc((RECEIVER, "415"))
            return _status_response(415, code_pb2.INVALID_ARGUMENT,
                                    "Content-Type must be application/x-protobuf or "
                                    "application/json", None)
        try:
            if admit is not None:
                admit()
            body = await _read_body(request, limits.max_body_bytes, limits.max_decompressed_bytes)
            return _ok_response(export(body, kind), kind)
        except _BodyError as exc:
            stats.requests_rejected.inc((RECEIVER, str(exc.status)))
            return _status_response(exc.status, _HTTP_TO_RPC[exc.status], str(exc), kind)
        except MalformedPayload as exc:
            stats.requests_rejected.inc((RECEIVER, "400"))
            return _status_response(400, code_pb2.INVALID_ARGUMENT, str(exc), kind)
        except Overloaded as exc:
            stats.requests_rejected.inc((RECEIVER, "429"))
            return _status_response(429, code_pb2.UNAVAILABLE, str(exc), kind,
                                    {"Retry-After": str(exc.retry_after)}, exc.retry_after)

    def export_traces(body: bytes, kind: str) -> ExportTraceServiceResponse:
        decoded = ingest.export_trace_payload(body, kind, RECEIVER)
        response = ExportTraceServiceResponse()
        partial_success(response, decoded)
        return response

    def export_metrics(body: bytes, kind: str) -> ExportMetricsServiceResponse:
        return ingest.export_metrics(parse_metrics_request(body, kind), RECEIVER)

    def export_logs(body: bytes, kind: str) -> ExportLogsServiceResponse:
        return ingest.export_logs(parse_logs_request(body, kind), RECEIVER)

    async def traces(request: Request) -> Response:
        return await handle(request, export_traces, ingest.admit_traces)

    async def metrics(request: Request) -> Response:
        return await handle(request, export_metrics)

    async def logs(request: Request) -> Response:
        return await handle(request, export_logs, ingest.admit_logs)

    endpoints: dict[str, Endpoint] = {TRACES_PATH: traces, METRICS_PATH: metrics,
                                      LOGS_PATH: logs}
    assert endpoints.keys() == OTLP_PATHS
    return endpoints


def otlp_router(endpoints: Mapping[str, Endpoint]) -> APIRouter:
    """The OTLP endpoints as routes of the web app (what OtlpFastPath does not take)."""
    router = APIRouter()
    for path, endpoint in endpoints.items():
        router.add_api_route(path, endpoint, methods=["POST"])
    return router


class OtlpFastPath:
    """ASGI middleware: a POST to an OTLP path goes straight to its endpoint, past the
    web framework's routing, dependency and exception layers, which a profile of the
    collector put at about a tenth of its CPU at 100-span exports (docs/performance.md).
    The endpoint and its answers are the same as through the router; everything else
    (other methods on these paths, every other path) goes on to the app. Installed
    inside the bearer-token check, so auth still comes first."""

    def __init__(self, app: ASGIApp, endpoints: Mapping[str, Endpoint]) -> None:
        self._app = app
        self._endpoints = dict(endpoints)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") == "POST":
            endpoint = self._endpoints.get(scope.get("path", ""))
            if endpoint is not None:
                response = await endpoint(Request(scope, receive))
                await response(scope, receive, send)
                return
        await self._app(scope, receive, send)
