"""OTLP/gRPC receiver: TraceService and MetricsService on a grpcio server."""

from __future__ import annotations

import logging
from concurrent import futures
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tokenpath.collector.auth import bearer_matches
from tokenpath.collector.receivers.ingest import OtlpIngest, Overloaded
from tokenpath.collector.stats import CollectorStats

log = logging.getLogger(__name__)
RECEIVER = "otlp_grpc"
DEFAULT_WORKERS = 4


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, ingest: OtlpIngest, stats: CollectorStats) -> None:
        self._ingest = ingest
        self._stats = stats

    def Export(
        self, request: ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> ExportTraceServiceResponse:
        try:
            decoded = self._ingest.export_traces(request, RECEIVER)
        except Overloaded as exc:
            self._stats.add(self._stats.requests_rejected, (RECEIVER, "UNAVAILABLE"))
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        response = ExportTraceServiceResponse()
        if decoded.rejected:
            response.partial_success.rejected_spans = decoded.rejected
            response.partial_success.error_message = decoded.error_message
        return response


class _MetricsService(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, ingest: OtlpIngest) -> None:
        self._ingest = ingest

    def Export(
        self, request: ExportMetricsServiceRequest, context: grpc.ServicerContext
    ) -> ExportMetricsServiceResponse:
        self._ingest.export_metrics(request, RECEIVER)
        return ExportMetricsServiceResponse()


class _BearerInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg]
    """Rejects calls without the bearer token before the request body is handled."""

    def __init__(self, token: str) -> None:
        self._token = token

        def deny(request: Any, context: grpc.ServicerContext) -> Any:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token")

        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        metadata = dict(handler_call_details.invocation_metadata or ())
        if bearer_matches(metadata.get("authorization"), self._token):
            return continuation(handler_call_details)
        return self._deny


class GrpcReceiver:
    """Owns the grpc.Server. ``start()`` binds; ``port`` is the bound port."""

    def __init__(self, ingest: OtlpIngest, stats: CollectorStats, host: str, port: int,
                 auth_token: str | None = None, max_message_bytes: int = 8 << 20) -> None:
        interceptors: list[Any] = [_BearerInterceptor(auth_token)] if auth_token else []
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=DEFAULT_WORKERS,
                                       thread_name_prefix="tokenpath-grpc"),
            interceptors=interceptors,
            options=[("grpc.max_receive_message_length", max_message_bytes)],
        )
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
            _TraceService(ingest, stats), self._server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(  # type: ignore[no-untyped-call]
            _MetricsService(ingest), self._server)
        self._address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self._host = host
        self.port = port
        self._started = False
        self._stopped = False

    def start(self) -> None:
        if self._started:
            return
        bound = self._server.add_insecure_port(self._address)
        if bound == 0:
            raise OSError(f"cannot bind gRPC listener on {self._address}")
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
