"""A router in front of collector replicas that does what the OpenTelemetry Collector's
loadbalancing exporter does in docs/deploy.md's two pipelines: ``POST /v1/traces`` is
split span by span by trace id (``routing_key: traceID``), ``POST /v1/logs`` ResourceLogs
by ResourceLogs by a hash of the resource attributes (``routing_key: resource``), both on
the exporter's consistent-hash ring (tests/deploy/hash_ring.py). A replica's error status
is passed back, so the exporters' retry behaviour meets the real answers."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.logs.v1.logs_pb2 import ResourceLogs
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans

from tests.deploy.hash_ring import HashRing

PROTOBUF = "application/x-protobuf"


def resource_key(resource_logs: ResourceLogs) -> bytes:
    """The resource's identity as the exporter hashes it: its attributes, sorted."""
    pairs = sorted((kv.key, kv.value.SerializeToString()) for kv in
                   resource_logs.resource.attributes)
    return b"".join(k.encode() + b"=" + v + b";" for k, v in pairs)


class LoadBalancingRouter:
    def __init__(self, replica_urls: list[str]) -> None:
        self._urls = replica_urls
        self.ring = HashRing(replica_urls)
        self.logs_routed: dict[str, int] = defaultdict(int)
        self.record_replica: dict[str, str] = {}  # a routed record's trace id: its replica
        router = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                del format, args

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/v1/traces":
                    status = router._route_traces(body)
                elif self.path == "/v1/logs":
                    status = router._route_logs(body)
                else:
                    status = 404
                self.send_response(status)
                if status in (429, 503):
                    self.send_header("Retry-After", "1")
                self.send_header("Content-Type", PROTOBUF)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _post(self, url: str, path: str, body: bytes) -> int:
        request = urllib.request.Request(f"{url}{path}", data=body,
                                         headers={"Content-Type": PROTOBUF})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except OSError:
            return 503

    def _route_traces(self, body: bytes) -> int:
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        parts: dict[str, ExportTraceServiceRequest] = defaultdict(ExportTraceServiceRequest)
        for resource_spans in message.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    out = parts[self.ring.endpoint_for(span.trace_id)]
                    target = ResourceSpans(resource=resource_spans.resource)
                    target.scope_spans.append(ScopeSpans(scope=scope_spans.scope,
                                                         spans=[span]))
                    out.resource_spans.append(target)
        statuses = [self._post(url, "/v1/traces", part.SerializeToString())
                    for url, part in parts.items()]
        return max(statuses, default=200)

    def _route_logs(self, body: bytes) -> int:
        message = ExportLogsServiceRequest()
        message.ParseFromString(body)
        parts: dict[str, ExportLogsServiceRequest] = defaultdict(ExportLogsServiceRequest)
        for resource_logs in message.resource_logs:
            url = self.ring.endpoint_for(resource_key(resource_logs))
            parts[url].resource_logs.append(resource_logs)
            for scope_logs in resource_logs.scope_logs:
                self.logs_routed[url] += len(scope_logs.log_records)
                for log in scope_logs.log_records:
                    self.record_replica[log.trace_id.hex()] = url
        statuses = [self._post(url, "/v1/logs", part.SerializeToString())
                    for url, part in parts.items()]
        return max(statuses, default=200)
