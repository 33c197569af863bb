"""A test HTTP server on 127.0.0.1, a free port, serving a handler class from a daemon
thread: the lifecycle every loopback double and receiver of the tests and benchmarks
shares."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing to stderr."""

    def log_message(self, format: str, *args: object) -> None:
        del format, args


class LoopbackHTTPServer:
    def __init__(self, handler: type[BaseHTTPRequestHandler], start: bool = True) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._closed = False
        if start:
            self.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> None:
        if not self._thread.is_alive() and not self._closed:
            self._thread.start()

    def shutdown(self) -> None:
        """Stop serving and close the socket. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()
