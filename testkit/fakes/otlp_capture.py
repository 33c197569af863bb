"""A tiny OTLP/gRPC trace receiver that keeps every span it is sent, for looking at what a
real exporter (vLLM, the plugin, a gateway) actually emits.

``python -m testkit.fakes.otlp_capture 127.0.0.1:PORT OUT.jsonl`` writes one JSON object per
span until interrupted.
"""

from __future__ import annotations

import json
import sys
import threading
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind)


def _attrs(attributes: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    kv: KeyValue
    for kv in attributes:
        out[kv.key] = _value(kv.value)
    return out


@dataclass
class CapturedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    start_unix_nano: int
    end_unix_nano: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    scope: str
    events: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


class CaptureServicer(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.spans: list[CapturedSpan] = []
        self.arrived = threading.Condition(self._lock)

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        batch: list[CapturedSpan] = []
        for rs in request.resource_spans:
            resource = _attrs(rs.resource.attributes)
            for ss in rs.scope_spans:
                for span in ss.spans:
                    batch.append(
                        CapturedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            kind=int(span.kind),
                            start_unix_nano=int(span.start_time_unix_nano),
                            end_unix_nano=int(span.end_time_unix_nano),
                            attributes=_attrs(span.attributes),
                            resource=resource,
                            scope=ss.scope.name,
                            events=[
                                {"name": e.name, "attributes": _attrs(e.attributes)}
                                for e in span.events
                            ],
                        )
                    )
        with self._lock:
            self.spans.extend(batch)
            self.arrived.notify_all()
        return trace_service_pb2.ExportTraceServiceResponse()

    def snapshot(self) -> list[CapturedSpan]:
        with self._lock:
            return list(self.spans)

    def wait_for(self, predicate: Any, timeout: float) -> list[CapturedSpan]:
        """Wait until ``predicate(spans)`` is true or ``timeout`` passes; return the spans."""
        with self._lock:
            self.arrived.wait_for(lambda: predicate(self.spans), timeout=timeout)
            return list(self.spans)


class CaptureReceiver:
    """Owns the gRPC server; ``start()`` binds, ``shutdown()`` stops (idempotent)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.servicer = CaptureServicer()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self.servicer, self._server)
        self.port = self._server.add_insecure_port(f"{host}:{port}")
        self.endpoint = f"{host}:{self.port}"
        self._stopped = False

    def start(self) -> CaptureReceiver:
        self._server.start()
        return self

    def shutdown(self) -> None:
        if not self._stopped:
            self._stopped = True
            self._server.stop(grace=1).wait()


def main(argv: list[str]) -> int:
    host, _, port = argv[0].rpartition(":")
    out = Path(argv[1])
    receiver = CaptureReceiver(host, int(port)).start()
    written = 0
    try:
        while True:
            spans = receiver.servicer.wait_for(lambda s, n=written: len(s) > n, timeout=1.0)
            with out.open("a") as fh:
                for span in spans[written:]:
                    fh.write(json.dumps(span.to_json()) + "\n")
            written = len(spans)
    except KeyboardInterrupt:
        return 0
    finally:
        receiver.shutdown()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
