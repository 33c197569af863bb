"""Loopback HTTP servers for the agent tests: engine /metrics pages and an OTLP sink."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from testkit.support.processes import free_port

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


class _QuietServer(ThreadingHTTPServer):
    """No traceback on stderr when a test's client drops a connection or ``before_get``
    raises to drop one."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass


class PageServer:
    """Serves ``pages[path]`` as Prometheus text; records POST bodies per path.

    With ``keep_alive`` it speaks HTTP/1.1 and keeps connections open (``connections``
    counts those accepted, ``gets`` the GETs received); ``drop_idle`` then closes each
    connection after its first response without saying so, as a server whose idle
    timeout passed. ``before_get`` runs before each GET is answered (to wait, or to raise
    and drop the connection unanswered)."""

    def __init__(self, *, keep_alive: bool = False) -> None:
        self.pages: dict[str, str] = {}
        self.posts: list[tuple[str, dict[str, str], bytes]] = []
        self.post_status = 200
        self.connections = 0
        self.gets = 0
        self.drop_idle = False
        self.before_get: Callable[[], object] | None = None  # runs before each GET answer
        owner = self

        class Handler(BaseHTTPRequestHandler):
            disable_nagle_algorithm = True
            protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

            def setup(self) -> None:
                super().setup()
                owner.connections += 1

            def end_headers(self) -> None:
                super().end_headers()
                if owner.drop_idle:
                    self.close_connection = True

            def do_GET(self) -> None:
                owner.gets += 1
                if owner.before_get is not None:
                    owner.before_get()
                body = owner.pages.get(self.path)
                if body is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", PROMETHEUS_TEXT)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                owner.posts.append((self.path, dict(self.headers.items()), body))
                self.send_response(owner.post_status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = _QuietServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def url(self, path: str) -> str:
        return self.base_url + path

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def page_server() -> Iterator[PageServer]:
    server = PageServer()
    yield server
    server.close()




@pytest.fixture
def dead_url() -> str:
    """A loopback URL nothing listens on (connection refused)."""
    return f"http://127.0.0.1:{free_port()}/metrics"
