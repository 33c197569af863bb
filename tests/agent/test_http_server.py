"""The agent listener: idle without waking, and a shutdown that cannot hang."""

from __future__ import annotations

import socket
import ssl
import threading

import httpx
import pytest

from testkit.support.certs import CertFiles, make_certs
from tokenpath.agent import http_server
from tokenpath.agent.http_server import AgentHttpServer
from tokenpath.auth import bearer_matches
from tokenpath.tls import TlsConfig


def test_shutdown_returns_when_no_connection_can_reach_the_listener(
        monkeypatch: pytest.MonkeyPatch) -> None:
    server = AgentHttpServer("127.0.0.1", 0, lambda: b"ok\n")
    server.start()
    assert httpx.get(f"http://127.0.0.1:{server.port}/metrics").text == "ok\n"

    def refused(*args: object, **kwargs: object) -> socket.socket:
        raise ConnectionRefusedError("blocked")

    # A firewall dropping loopback connections must not keep the agent from stopping.
    monkeypatch.setattr(http_server.socket, "create_connection", refused)
    done = threading.Event()
    stopper = threading.Thread(target=lambda: (server.shutdown(), done.set()))
    stopper.start()
    stopper.join(http_server.SHUTDOWN_TIMEOUT_SECONDS + 5)
    assert done.is_set()


def _exchange(port: int, raw: bytes) -> tuple[str, bool]:
    """Sends ``raw`` on one connection; returns what came back and whether the server
    closed the connection (False when it was still open after a quiet while)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(5)
        sock.sendall(raw)
        data = b""
        closed = False
        try:
            while chunk := sock.recv(65536):
                data += chunk
            closed = True
        except TimeoutError:
            pass
    return data.decode("latin-1"), closed


def _statuses(reply: str) -> list[str]:
    return [line for line in reply.splitlines() if line.startswith("HTTP/1.1 ")]


_PIPELINED_GET = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.mark.parametrize("head", [
    b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n",   # 405
    b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n",    # 401
    b"GET /nope HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n",       # 404
])
def test_an_unread_request_body_is_never_parsed_as_the_next_request(head: bytes) -> None:
    server = AgentHttpServer("127.0.0.1", 0, lambda: b"m 1\n", auth_token="s3cret")
    server.start()
    try:
        # The body is itself a valid (authorized) request: it must not be answered.
        body = b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\n\r\n"
        reply, closed = _exchange(server.port, head % len(body) + body)
    finally:
        server.shutdown()
    statuses = _statuses(reply)
    assert len(statuses) == 1 and statuses[0].split()[1] in ("401", "404", "405")
    assert "\r\nConnection: close\r\n" in reply
    assert closed


def test_a_chunked_request_body_closes_the_connection() -> None:
    server = AgentHttpServer("127.0.0.1", 0, lambda: b"m 1\n")
    server.start()
    try:
        reply, closed = _exchange(
            server.port, b"POST /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked"
                         b"\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + _PIPELINED_GET)
    finally:
        server.shutdown()
    assert _statuses(reply) == ["HTTP/1.1 405 Method Not Allowed"]
    assert "\r\nConnection: close\r\n" in reply
    assert closed


def test_a_kept_alive_connection_without_a_body_serves_the_next_request() -> None:
    server = AgentHttpServer("127.0.0.1", 0, lambda: b"m 1\n", auth_token="s3cret")
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.settimeout(5)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
                         + _PIPELINED_GET)
            data = b""
            while data.count(b"HTTP/1.1 ") < 2:
                data += sock.recv(65536)
    finally:
        server.shutdown()
    assert data.startswith(b"HTTP/1.1 401 ")
    assert b"HTTP/1.1 200 OK" in data


@pytest.mark.parametrize("header", [
    "Bearer s3cret", "bearer s3cret", "BEARER s3cret", "Bearer  s3cret",
])
def test_the_bearer_check_matches_the_collectors(header: str) -> None:
    server = AgentHttpServer("127.0.0.1", 0, lambda: b"m 1\n", auth_token="s3cret")
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        assert bearer_matches(header, "s3cret")
        assert httpx.get(url, headers={"Authorization": header}).status_code == 200
        for wrong in ("Bearer s3cre", "Basic s3cret", "s3cret", "Bearers3cret"):
            assert not bearer_matches(wrong, "s3cret")
            assert httpx.get(url, headers={"Authorization": wrong}).status_code == 401
    finally:
        server.shutdown()


def test_an_idle_connection_is_closed() -> None:
    server = AgentHttpServer("127.0.0.1", 0, lambda: b"m 1\n", idle_timeout=0.2)
    server.start()
    try:
        # One that never sends a request, and one idle after a kept-alive request.
        reply, closed = _exchange(server.port, b"")
        assert reply == "" and closed
        reply, closed = _exchange(server.port, _PIPELINED_GET)
        assert _statuses(reply) == ["HTTP/1.1 200 OK"] and closed
    finally:
        server.shutdown()


def test_the_default_listener_has_a_finite_idle_timeout() -> None:
    server = AgentHttpServer("127.0.0.1", 0, lambda: b"m 1\n")
    try:
        assert server._server.idle_timeout == http_server.IDLE_TIMEOUT_SECONDS
        assert 0 < http_server.IDLE_TIMEOUT_SECONDS < float("inf")
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    return make_certs(tmp_path_factory.mktemp("certs"))


def _client_context(certs: CertFiles, with_certificate: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs.ca))
    if with_certificate:
        context.load_cert_chain(str(certs.client_cert), str(certs.client_key))
    return context


def test_tls_serves_metrics_and_refuses_plain_http(certs: CertFiles) -> None:
    tls = TlsConfig(cert=str(certs.server_cert), key=str(certs.server_key))
    server = AgentHttpServer("127.0.0.1", 0, lambda: b"ok\n", tls=tls.server_context())
    server.start()
    try:
        assert server.scheme == "https"
        url = f"https://localhost:{server.port}/metrics"
        assert httpx.get(url, verify=_client_context(certs, False)).text == "ok\n"
        with pytest.raises(httpx.HTTPError):  # plain HTTP gets no answer from a TLS port
            httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=3)
        # The failed handshake cost no more than its own connection.
        assert httpx.get(url, verify=_client_context(certs, False)).text == "ok\n"
    finally:
        server.shutdown()


def test_mutual_tls_requires_a_client_certificate_from_the_client_ca(certs: CertFiles) -> None:
    tls = TlsConfig(cert=str(certs.server_cert), key=str(certs.server_key),
                    client_ca=str(certs.ca))
    server = AgentHttpServer("127.0.0.1", 0, lambda: b"ok\n", tls=tls.server_context())
    server.start()
    try:
        url = f"https://localhost:{server.port}/metrics"
        with pytest.raises(httpx.HTTPError):
            httpx.get(url, verify=_client_context(certs, False), timeout=3)
        assert httpx.get(url, verify=_client_context(certs, True)).text == "ok\n"
    finally:
        server.shutdown()
