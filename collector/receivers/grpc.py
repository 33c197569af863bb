"""OTLP/gRPC receiver: TraceService, MetricsService and LogsService (forwarded request
records, collector/record_logs.py) on a grpcio server.

The methods are registered as generic handlers that take the raw request bytes and parse
them here, so a malformed message answers INVALID_ARGUMENT as the OTLP spec requires
(grpcio's generated handlers would fail deserialization with INTERNAL before any of our
code ran). Load shedding answers UNAVAILABLE with a ``google.rpc.RetryInfo`` detail.
Bearer auth is an interceptor that decides on the call's metadata alone and refuses
without reading the request message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent import futures
from typing import Any, NoReturn

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from tokenpath.auth import bearer_matches
from tokenpath.collector.receivers.ingest import OtlpIngest, Overloaded, partial_success
from tokenpath.collector.receivers.otlp_decode import (
    MalformedPayload,
    parse_logs_request,
    parse_metrics_request,
)
from tokenpath.collector.stats import CollectorStats
from tokenpath.config import ConfigError
from tokenpath.endpoints import host_port
from tokenpath.tls import TlsConfig

log = logging.getLogger(__name__)
RECEIVER = "otlp_grpc"
DEFAULT_WORKERS = 4
# RPCs in progress or waiting for a worker, each holding its request (up to the message
# cap): past this, grpcio answers RESOURCE_EXHAUSTED at once, so a flood of exporters
# cannot queue requests without bound in front of the workers.
DEFAULT_MAX_CONCURRENT_RPCS = 64
TRACE_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
METRICS_SERVICE = "opentelemetry.proto.collector.metrics.v1.MetricsService"
LOGS_SERVICE = "opentelemetry.proto.collector.logs.v1.LogsService"
EXPORT_METHOD = "Export"


def retry_status(message: str, retry_after_seconds: int) -> grpc.Status:
    """UNAVAILABLE carrying RetryInfo in grpc-status-details-bin (OTLP throttling)."""
    info = error_details_pb2.RetryInfo(
        retry_delay=duration_pb2.Duration(seconds=retry_after_seconds))
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(code=code_pb2.UNAVAILABLE, message=message, details=[detail])
    return rpc_status.to_status(status)


class _OtlpServices:
    """The Export behaviours of both services, on raw bytes."""

    def __init__(self, ingest: OtlpIngest, stats: CollectorStats) -> None:
        self._ingest = ingest
        self._stats = stats

    def _refuse(self, context: grpc.ServicerContext, code: grpc.StatusCode,
                message: str) -> NoReturn:
        self._stats.requests_rejected.inc((RECEIVER, code.name))
        context.abort(code, message)
        raise AssertionError("unreachable")  # context.abort raises

    def _shed(self, context: grpc.ServicerContext, exc: Overloaded) -> NoReturn:
        self._stats.requests_rejected.inc((RECEIVER, grpc.StatusCode.UNAVAILABLE.name))
        context.abort_with_status(retry_status(str(exc), exc.retry_after))
        raise AssertionError("unreachable")

    def export_traces(self, body: bytes, context: grpc.ServicerContext
                      ) -> ExportTraceServiceResponse:
        try:
            decoded = self._ingest.export_trace_payload(body, "protobuf", RECEIVER)
        except MalformedPayload as exc:
            self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Overloaded as exc:
            self._shed(context, exc)
        response = ExportTraceServiceResponse()
        partial_success(response, decoded)
        return response

    def export_metrics(self, body: bytes, context: grpc.ServicerContext
                       ) -> ExportMetricsServiceResponse:
        try:
            return self._ingest.export_metrics(parse_metrics_request(body, "protobuf"),
                                               RECEIVER)
        except MalformedPayload as exc:
            self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))


    def export_logs(self, body: bytes, context: grpc.ServicerContext
                    ) -> ExportLogsServiceResponse:
        try:
            message = parse_logs_request(body, "protobuf")
            self._ingest.admit_logs()
            return self._ingest.export_logs(message, RECEIVER)
        except MalformedPayload as exc:
            self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Overloaded as exc:
            self._shed(context, exc)


def _serialize(message: Any) -> bytes:
    return bytes(message.SerializeToString())


def _handler(service: str, behaviour: Callable[[bytes, grpc.ServicerContext], Any]
             ) -> grpc.GenericRpcHandler:  # type: ignore[type-arg]
    method = grpc.unary_unary_rpc_method_handler(
        behaviour, request_deserializer=None, response_serializer=_serialize)
    return grpc.method_handlers_generic_handler(service, {EXPORT_METHOD: method})


class _BearerInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """Refuses calls without the bearer token, looking only at the call's metadata.

    The refusal handler is stream-unary and never touches the request iterator, so the
    request message is not deserialized or handed to any of our code.
    """

    def __init__(self, token: str, stats: CollectorStats) -> None:
        self._token = token

        def deny(request_iterator: Any, context: grpc.ServicerContext) -> Any:
            del request_iterator
            stats.requests_rejected.inc((RECEIVER, grpc.StatusCode.UNAUTHENTICATED.name))
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token")

        self._deny = grpc.stream_unary_rpc_method_handler(deny)

    def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        header = None
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                header = value
                break
        if bearer_matches(header, self._token):
            return continuation(handler_call_details)
        return self._deny


class GrpcReceiver:
    """Owns the grpc.Server. ``start()`` binds; ``port`` is the bound port."""

    def __init__(self, ingest: OtlpIngest, stats: CollectorStats, host: str, port: int,
                 auth_token: str | None = None, max_message_bytes: int = 8 << 20,
                 tls: TlsConfig | None = None) -> None:
        interceptors: list[Any] = [_BearerInterceptor(auth_token, stats)] if auth_token else []
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=DEFAULT_WORKERS,
                                       thread_name_prefix="tokenpath-grpc"),
            interceptors=interceptors,
            maximum_concurrent_rpcs=DEFAULT_MAX_CONCURRENT_RPCS,
            # grpcio sets SO_REUSEPORT by default: a second collector on a busy port would
            # start and take half the clients. Off, a busy port fails start() as HTTP does.
            options=[("grpc.max_receive_message_length", max_message_bytes),
                     ("grpc.so_reuseport", 0)],
        )
        services = _OtlpServices(ingest, stats)
        self._server.add_generic_rpc_handlers((
            _handler(TRACE_SERVICE, services.export_traces),
            _handler(METRICS_SERVICE, services.export_metrics),
            _handler(LOGS_SERVICE, services.export_logs),
        ))
        self._address = host_port(host, port)
        self._host = host
        self._tls = tls or TlsConfig()
        self.port = port
        self._started = False
        self._stopped = False

    def start(self) -> None:
        if self._started:
            return
        try:
            if self._tls.enabled:
                bound = self._server.add_secure_port(self._address,
                                                     self._tls.grpc_credentials())
            else:
                bound = self._server.add_insecure_port(self._address)
        except RuntimeError:  # grpcio >= 1.60 raises where older versions returned 0
            bound = 0
        if bound == 0:
            raise ConfigError("grpc", f"cannot listen on {self._address} (in use, or not "
                              "an address of this host)")
        self.port = bound
        self._server.start()
        self._started = True

    @property
    def endpoint(self) -> str:
        return f"{self._host}:{self.port}"

    def shutdown(self, grace: float = 2.0) -> None:
        if self._started and not self._stopped:
            self._stopped = True
            self._server.stop(grace).wait()
