"""An OTLP/HTTP trace endpoint on loopback that keeps each request body, for tests of
what real exporters send."""

from __future__ import annotations

import gzip

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from testkit.support.loopback_http import LoopbackHTTPServer, QuietHandler


class OtlpHttpReceiver:
    """An OTLP/HTTP endpoint on loopback keeping each request body (decompressed)."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.status = 200
        receiver = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                assert self.headers["Content-Type"] == "application/x-protobuf"
                receiver.bodies.append(body)
                payload = ExportTraceServiceResponse().SerializeToString()
                self.send_response(receiver.status)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self._server = LoopbackHTTPServer(Handler)
        self.url = f"{self._server.base_url}/v1/traces"

    def close(self) -> None:
        self._server.shutdown()
