"""The agent's listener: ``GET /metrics`` (Prometheus text) and ``GET /healthz``.

A small threaded ``http.server``: no framework in the agent's hot path. When a bearer
token is configured, ``/metrics`` requires ``Authorization: Bearer <token>`` (checked with
the collector's constant-time ``bearer_matches`` before anything is rendered; the token is
never logged); ``/healthz`` stays open for kubelet probes. With a certificate and key the
listener speaks TLS, and with a client CA it requires client certificates (mTLS); the
handshake runs in the connection's own thread.

No request body is ever read: a reply to a request that carries one (``Content-Length`` over
0 or any ``Transfer-Encoding``) closes the connection, so the body is never parsed as the
next request. A connection idle for ``IDLE_TIMEOUT_SECONDS`` is closed, so idle kept-alive
connections do not hold handler threads forever.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from tokenpath.auth import bearer_matches

logger = logging.getLogger(__name__)

METRICS_PATH = "/metrics"
HEALTHZ_PATH = "/healthz"
# The idle listener blocks in select() without a timeout, so it wakes only for requests.
# shutdown() wakes it by shutting the listening socket down (on Linux that makes select()
# return, with no network path needed); where that does not, by connecting to it, retried
# at WAKE_RETRY_SECONDS for at most SHUTDOWN_TIMEOUT_SECONDS.
WAKE_RETRY_SECONDS = 0.05
SHUTDOWN_TIMEOUT_SECONDS = 5.0
# A connection that sends nothing (no request, or nothing more on a kept-alive connection)
# for this long is closed, freeing its handler thread.
IDLE_TIMEOUT_SECONDS = 30.0


class _Handler(BaseHTTPRequestHandler):
    server: _AgentHttpServer
    protocol_version = "HTTP/1.1"
    # Headers and body leave in one write, and without Nagle: no 40 ms delayed-ACK
    # stall on kept-alive scrape connections.
    disable_nagle_algorithm = True
    wbufsize = -1

    def setup(self) -> None:
        super().setup()
        # A read that waits longer raises TimeoutError, which handle_one_request turns
        # into closing the connection.
        self.connection.settimeout(self.server.idle_timeout)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == HEALTHZ_PATH:
            self._reply(200, b"ok\n", "text/plain; charset=utf-8")
        elif path == METRICS_PATH:
            if not self.server.authorized(self.headers.get("Authorization")):
                self._reply(401, b"unauthorized\n", "text/plain; charset=utf-8",
                            {"WWW-Authenticate": "Bearer"})
                return
            try:
                body = self.server.render()
            except Exception:
                logger.exception("rendering /metrics failed")
                self._reply(500, b"error\n", "text/plain; charset=utf-8")
                return
            self._reply(200, body, CONTENT_TYPE_LATEST)
        else:
            self._reply(404, b"not found\n", "text/plain; charset=utf-8")

    def _not_allowed(self) -> None:
        self._reply(405, b"method not allowed\n", "text/plain; charset=utf-8",
                    {"Allow": "GET"})

    do_POST = do_PUT = do_DELETE = do_PATCH = _not_allowed

    def _reply(self, status: int, body: bytes, content_type: str,
               headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if self._has_body():
            # The body is never read: left on a kept-alive connection it would be parsed
            # as the next request. send_header sets close_connection for this header.
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _has_body(self) -> bool:
        if "Transfer-Encoding" in self.headers:
            return True
        length = self.headers.get("Content-Length")
        if length is None:
            return False
        try:
            return int(length) > 0
        except ValueError:
            return True

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s " + format, self.address_string(), *args)


class _AgentHttpServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], render: Callable[[], bytes],
                 auth_token: str | None, idle_timeout: float,
                 tls: ssl.SSLContext | None) -> None:
        super().__init__(address, _Handler)
        self.render = render
        self.idle_timeout = idle_timeout
        self._token = auth_token or None
        self._tls = tls

    def finish_request(self, request: Any, client_address: Any) -> None:
        """In the connection's own thread: the TLS handshake (when TLS is on; a slow or
        failing client never holds up accepting others), then the request."""
        if self._tls is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(self.idle_timeout)
        try:
            secure = self._tls.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as exc:  # no certificate under mTLS, plain HTTP
            logger.debug("TLS handshake with %s failed: %s", client_address[0], exc)
            return
        try:
            super().finish_request(secure, client_address)
        finally:
            secure.close()

    def authorized(self, header: str | None) -> bool:
        if self._token is None:
            return True
        return bearer_matches(header, self._token)


class AgentHttpServer:
    """Serves ``render()`` (Prometheus text, e.g. ``generate_latest(registry)``) as
    ``/metrics`` on ``host:port`` (port 0 picks a free one), over TLS with ``tls`` (a
    server context: ``TlsConfig.server_context()``). A connection idle for
    ``idle_timeout`` seconds is closed."""

    def __init__(self, host: str, port: int, render: Callable[[], bytes],
                 *, auth_token: str | None = None,
                 idle_timeout: float = IDLE_TIMEOUT_SECONDS,
                 tls: ssl.SSLContext | None = None) -> None:
        self._server = _AgentHttpServer((host, port), render, auth_token, idle_timeout, tls)
        self.scheme = "http" if tls is None else "https"
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def host(self) -> str:
        return str(self._server.server_address[0])

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever,
                                            args=(None,),
                                            name="tokenpath-agent-http", daemon=True)
            self._thread.start()

    def shutdown(self) -> None:
        if self._thread is not None:
            stopper = threading.Thread(target=self._server.shutdown, daemon=True)
            stopper.start()
            with contextlib.suppress(OSError):
                self._server.socket.shutdown(socket.SHUT_RDWR)
            deadline = time.monotonic() + SHUTDOWN_TIMEOUT_SECONDS
            stopper.join(WAKE_RETRY_SECONDS)
            while stopper.is_alive() and time.monotonic() < deadline:
                self._wake_listener()
                stopper.join(WAKE_RETRY_SECONDS)
            if stopper.is_alive():
                logger.warning("agent listener did not stop within %.0f s",
                               SHUTDOWN_TIMEOUT_SECONDS)
            else:
                self._thread.join()
            self._thread = None
        self._server.server_close()

    def _wake_listener(self) -> None:
        """Connects to the listener and hangs up, so its select() returns."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        try:
            socket.create_connection((host, self.port), timeout=WAKE_RETRY_SECONDS).close()
        except OSError:
            logger.debug("could not wake the listener on %s:%s", host, self.port)
