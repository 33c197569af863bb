"""A router in front of collector replicas that does what the OpenTelemetry Collector's
loadbalancing exporter does in docs/deploy.md's two pipelines: ``POST /v1/traces`` is
split span by span by trace id (``routing_key: traceID``), ``POST /v1/logs`` ResourceLogs
by ResourceLogs by a hash of the resource attributes (``routing_key: resource``), both on
the exporter's consistent-hash ring (tests/deploy/hash_ring.py). A replica's error status
is passed back, so the exporters' retry behaviour meets the real answers.

Each replica forwards to its own path, ``/from/<index>/v1/logs``, so a test can make the
route misbehave for one replica's posts as a real one may: hold them back and release
them later (:meth:`hold`, :meth:`release`), or delay each by a random time and deliver
them out of order, its progress messages at once ahead of its records (:meth:`delay`).
:meth:`remove` takes a dead replica off the ring, as the exporter's resolver does."""

from __future__ import annotations

import random
import re
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.logs.v1.logs_pb2 import ResourceLogs
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans

from tests.deploy.hash_ring import HashRing
from tokenpath.collector.record_logs import PROGRESS_EVENT_NAME, RECORD_EVENT_NAME

PROTOBUF = "application/x-protobuf"
FROM_PATH = re.compile(r"/from/(\d+)(/v1/logs)")
DELAYED_DELIVERY_ATTEMPTS = 600  # a delayed post retried while the replica refuses it


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
        self._lock = threading.Lock()
        self._held: dict[int, list[bytes]] = {}  # replica index: its posts held back
        self._delays: dict[int, tuple[random.Random, float, float]] = {}
        self._timers: list[threading.Timer] = []
        router = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                del format, args

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                path, source = self.path, None
                match = FROM_PATH.fullmatch(path)
                if match is not None:
                    path, source = match.group(2), int(match.group(1))
                if path == "/v1/traces":
                    status = router._route_traces(body)
                elif path == "/v1/logs":
                    status = router._accept_logs(body, source)
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
        for timer in self._timers:
            timer.cancel()
        self._server.shutdown()
        self._server.server_close()

    def forward_url(self, index: int) -> str:
        """Where replica ``index`` forwards its records."""
        return f"{self.url}/from/{index}/v1/logs"

    def hold(self, source: int) -> None:
        """Accept replica ``source``'s posts but deliver none of them until released."""
        with self._lock:
            self._held.setdefault(source, [])

    def release(self, source: int) -> None:
        """Deliver what was held, in the order it came, and route as usual again."""
        with self._lock:
            held = self._held.pop(source, [])
        self._deliver_later(held, 0.0)

    def delay(self, source: int, low: float, high: float, seed: int = 0) -> None:
        """Each of replica ``source``'s posts: its progress delivered at once, its records
        after a random ``low`` to ``high`` seconds (so out of order)."""
        with self._lock:
            self._delays[source] = (random.Random(seed), low, high)

    def undelay(self, source: int) -> None:
        with self._lock:
            self._delays.pop(source, None)

    def remove(self, url: str) -> None:
        """Take a replica off the ring (it died)."""
        self._urls = [u for u in self._urls if u != url]
        self.ring = HashRing(self._urls)

    def _accept_logs(self, body: bytes, source: int | None) -> int:
        with self._lock:
            held = self._held.get(source) if source is not None else None
            if held is not None:
                held.append(body)
                return 200
            delay = self._delays.get(source) if source is not None else None
            seconds = None if delay is None else delay[0].uniform(delay[1], delay[2])
        if seconds is None:
            return self._route_logs(body)
        progress, records = _split_progress(body)
        if progress is not None:
            self._route_logs(progress)
        if records is not None:
            self._deliver_later([records], seconds)
        return 200

    def _deliver_later(self, bodies: list[bytes], seconds: float) -> None:
        """Deliver ``bodies`` in order after ``seconds``, each retried while refused."""
        def deliver() -> None:
            for body in bodies:
                for _ in range(DELAYED_DELIVERY_ATTEMPTS):
                    if self._route_logs(body) == 200:
                        break
                    time.sleep(0.5)

        timer = threading.Timer(seconds, deliver)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

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
                for log in scope_logs.log_records:
                    if log.event_name == RECORD_EVENT_NAME:
                        self.logs_routed[url] += 1
                        self.record_replica[log.trace_id.hex()] = url
        statuses = [self._post(url, "/v1/logs", part.SerializeToString())
                    for url, part in parts.items()]
        return max(statuses, default=200)


def _split_progress(body: bytes) -> tuple[bytes | None, bytes | None]:
    """An export's progress log records and its other log records, as two exports."""
    message = ExportLogsServiceRequest()
    message.ParseFromString(body)
    progress, records = ExportLogsServiceRequest(), ExportLogsServiceRequest()
    for resource_logs in message.resource_logs:
        for scope_logs in resource_logs.scope_logs:
            for log in scope_logs.log_records:
                target = progress if log.event_name == PROGRESS_EVENT_NAME else records
                part = ResourceLogs(resource=resource_logs.resource)
                part.scope_logs.add(scope=scope_logs.scope).log_records.append(log)
                target.resource_logs.append(part)
    return (progress.SerializeToString() if progress.resource_logs else None,
            records.SerializeToString() if records.resource_logs else None)
