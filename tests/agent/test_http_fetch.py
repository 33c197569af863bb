"""The agent's keep-alive HTTP client against real loopback servers, split GETs included."""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from tests.agent.conftest import PageServer
from tokenpath.agent.http_fetch import (
    KEEP_ALIVE_REUSE_SECONDS,
    MAX_IDLE_PER_ORIGIN,
    CompletedResponse,
    KeepAliveHttpClient,
    PendingResponse,
    begin_get,
)

TIMEOUT = 2.0


@pytest.fixture
def http11_server() -> Iterator[PageServer]:
    server = PageServer(keep_alive=True)
    server.pages["/a"] = "page a\n"
    server.pages["/b"] = "page b\n"
    yield server
    server.close()


def frozen_clock() -> float:
    """Time stands still: kept-alive connections never age out of reuse."""
    return 0.0


@pytest.fixture
def client() -> Iterator[KeepAliveHttpClient]:
    client = KeepAliveHttpClient(TIMEOUT, clock=frozen_clock)
    yield client
    client.close()


def test_gets_reuse_one_kept_alive_connection(http11_server: PageServer,
                                              client: KeepAliveHttpClient) -> None:
    for _ in range(3):
        assert client.get(http11_server.url("/a")).text == "page a\n"
    assert http11_server.connections == 1


def test_split_gets_sent_together_and_read_later(http11_server: PageServer,
                                                 client: KeepAliveHttpClient) -> None:
    first = begin_get(client, http11_server.url("/a"))
    second = begin_get(client, http11_server.url("/b"))  # same origin: its own connection
    missing = begin_get(client, http11_server.url("/nothing"))
    assert second.result().text == "page b\n"
    assert first.result().text == "page a\n"
    assert missing.result().status_code == 404
    assert http11_server.connections == 3
    # Read connections go back to the pool and serve the next round of requests.
    again = [begin_get(client, http11_server.url(path)) for path in ("/a", "/b", "/a")]
    assert [pending.result().text for pending in again] == ["page a\n", "page b\n",
                                                            "page a\n"]
    assert http11_server.connections == 3


def test_the_pool_keeps_a_bounded_number_of_idle_connections(
        http11_server: PageServer, client: KeepAliveHttpClient) -> None:
    pending = [begin_get(client, http11_server.url("/a"))
               for _ in range(MAX_IDLE_PER_ORIGIN + 2)]
    for request in pending:
        assert request.result().status_code == 200
    assert http11_server.connections == MAX_IDLE_PER_ORIGIN + 2
    again = [begin_get(client, http11_server.url("/a"))
             for _ in range(MAX_IDLE_PER_ORIGIN + 2)]
    for request in again:
        request.result()
    # Only MAX_IDLE_PER_ORIGIN were kept, so two new connections were opened.
    assert http11_server.connections == MAX_IDLE_PER_ORIGIN + 4


def test_split_get_reuses_the_pooled_connection(http11_server: PageServer,
                                                client: KeepAliveHttpClient) -> None:
    client.get(http11_server.url("/a"))
    for _ in range(3):
        assert begin_get(client, http11_server.url("/b")).result().text == "page b\n"
    assert http11_server.connections == 1


@pytest.mark.parametrize("split", [False, True])
def test_a_connection_the_server_dropped_is_retried_once(
        http11_server: PageServer, client: KeepAliveHttpClient, split: bool) -> None:
    http11_server.drop_idle = True
    assert client.get(http11_server.url("/a")).text == "page a\n"
    # The client still holds the connection the server has closed.
    response = (begin_get(client, http11_server.url("/b")).result() if split
                else client.get(http11_server.url("/b")))
    assert response.text == "page b\n"
    assert http11_server.connections == 2


def test_a_dead_endpoint_fails_from_result(dead_url: str,
                                           client: KeepAliveHttpClient) -> None:
    pending = begin_get(client, dead_url)
    with pytest.raises(ConnectionRefusedError):
        pending.result()


def _socket(pending: PendingResponse) -> socket.socket:
    """The socket a split request was sent on."""
    connection = pending._connection  # type: ignore[attr-defined]
    assert connection is not None and connection.sock is not None
    sock: socket.socket = connection.sock
    return sock


def test_result_is_read_once_and_cancel_closes(http11_server: PageServer,
                                               client: KeepAliveHttpClient) -> None:
    pending = begin_get(client, http11_server.url("/a"))
    assert pending.result().status_code == 200
    with pytest.raises(RuntimeError, match="already read"):
        pending.result()
    cancelled = begin_get(client, http11_server.url("/b"))
    sock = _socket(cancelled)
    cancelled.cancel()
    assert sock.fileno() == -1
    with pytest.raises(RuntimeError):
        cancelled.result()


def test_a_timeout_is_not_retried(http11_server: PageServer) -> None:
    client = KeepAliveHttpClient(timeout=0.3, clock=frozen_clock)
    try:
        client.get(http11_server.url("/a"))  # a kept-alive connection: retry allowed
        released = threading.Event()
        http11_server.before_get = lambda: released.wait(5.0)
        pending = begin_get(client, http11_server.url("/a"))
        with pytest.raises(TimeoutError):
            pending.result()
        released.set()
        assert http11_server.gets == 2  # the first get and the timed-out one, once
    finally:
        client.close()


def test_a_failure_on_a_new_connection_is_not_retried(http11_server: PageServer,
                                                      client: KeepAliveHttpClient) -> None:
    def drop() -> None:
        raise ConnectionAbortedError("dropped unanswered")

    http11_server.before_get = drop
    with pytest.raises(http.client.RemoteDisconnected):
        begin_get(client, http11_server.url("/a")).result()
    with pytest.raises(http.client.RemoteDisconnected):
        client.get(http11_server.url("/a"))
    assert http11_server.gets == 2


def test_the_retry_uses_a_new_connection_not_another_pooled_one(
        http11_server: PageServer, client: KeepAliveHttpClient) -> None:
    http11_server.drop_idle = True  # every pooled connection is dead on its next use
    pending = [begin_get(client, http11_server.url("/a")) for _ in range(3)]
    for request in pending:
        request.result()
    assert client.get(http11_server.url("/b")).text == "page b\n"
    assert begin_get(client, http11_server.url("/b")).result().text == "page b\n"
    assert http11_server.connections == 5  # three pooled, then one new per retry


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/m\u00e9trics", "http://bad host:80/metrics",
                                 "http://" + "a" * 64 + ".example/metrics",
                                 "ftp://example/metrics"])
def test_a_url_http_client_cannot_use_fails_from_result(
        client: KeepAliveHttpClient, url: str) -> None:
    pending = begin_get(client, url)
    with pytest.raises(Exception):  # noqa: B017 -- each URL fails its own way
        pending.result()


def test_a_client_without_split_requests_completes_at_once(
        http11_server: PageServer, dead_url: str) -> None:
    with httpx.Client(timeout=TIMEOUT) as plain:
        pending = begin_get(plain, http11_server.url("/a"))
        assert isinstance(pending, CompletedResponse)
        assert pending.result().text == "page a\n"
        failed = begin_get(plain, dead_url)
        with pytest.raises(httpx.ConnectError):
            failed.result()


def test_a_request_ending_after_close_does_not_keep_its_connection(
        http11_server: PageServer) -> None:
    client = KeepAliveHttpClient(TIMEOUT)
    pending = begin_get(client, http11_server.url("/a"))
    sock = _socket(pending)
    client.close()
    assert pending.result().text == "page a\n"
    assert sock.fileno() == -1


@pytest.mark.parametrize("split", [False, True])
def test_a_connection_is_reused_only_while_younger_than_the_servers_idle_timeout(
        http11_server: PageServer, split: bool) -> None:
    now = [100.0]
    client = KeepAliveHttpClient(TIMEOUT, clock=lambda: now[0])

    def get() -> None:
        response = (begin_get(client, http11_server.url("/a")).result() if split
                    else client.get(http11_server.url("/a")))
        assert response.text == "page a\n"

    try:
        get()
        now[0] += KEEP_ALIVE_REUSE_SECONDS  # sent this long ago: still reused
        get()
        assert http11_server.connections == 1
        now[0] += KEEP_ALIVE_REUSE_SECONDS + 0.5  # older: closed and replaced
        get()
        assert http11_server.connections == 2
    finally:
        client.close()
