"""An OTLP/HTTP trace endpoint on loopback that keeps each request body, for tests of
what real exporters send."""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse


class OtlpHttpReceiver:
    """An OTLP/HTTP endpoint on loopback keeping each request body (decompressed)."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.status = 200
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

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

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1/traces"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
