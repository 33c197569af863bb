"""A small keep-alive HTTP client on ``http.client`` for the agent's hot path.

The agent makes a few requests per second forever (engine /metrics pages, OTLP pushes),
so per-request CPU matters: on the bench machine an ``httpx.Client`` GET of a vLLM page
cost ~1.9 ms of CPU against ~0.6 ms here (see docs/agent.md). Anything with the same
``get``/``post``/``close`` shape can be injected instead, ``httpx.Client`` included.

A GET can also be split in two (:func:`begin_get`): the request is sent now and its
response read later. The engine scraper sends every engine's request together at one
poll and reads the answers at the next, so the poll thread does not sleep while an
engine renders its page (each such wait is a thread wake-up, and on a shared VM a
wake-up costs milliseconds of CPU). Clients without ``begin_get`` (``httpx.Client``)
complete the request at once.
"""

from __future__ import annotations

import http.client
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

OriginKey = tuple[str, str, int]
# Idle kept-alive connections kept per origin (several engines may share a host:port
# behind one path each, and their requests are in flight together).
MAX_IDLE_PER_ORIGIN = 8
# A kept-alive connection is reused only this long after its last request was sent;
# older ones are closed and replaced. uvicorn, and so vLLM and SGLang, close connections
# idle for 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE): reusing one near that age races the
# server's close and ends in a retry.
KEEP_ALIVE_REUSE_SECONDS = 4.0
# What a kept-alive connection the server has closed (idle timeout) fails with: the
# request is sent once more on a new connection. A timeout is not among them.
# (http.client.RemoteDisconnected, an answer that never came, is a ConnectionResetError.)
CLOSED_CONNECTION_ERRORS: tuple[type[Exception], ...] = (
    ConnectionResetError, BrokenPipeError, ConnectionAbortedError,
)


class HttpResponse(Protocol):
    @property
    def status_code(self) -> int: ...

    @property
    def text(self) -> str: ...


class HttpClient(Protocol):
    """What the engine scraper and the OTLP pusher need (``httpx.Client`` fits)."""

    def get(self, url: str) -> HttpResponse: ...

    def post(self, url: str, *, content: bytes, headers: dict[str, str]) -> HttpResponse: ...

    def close(self) -> None: ...


class PendingResponse(Protocol):
    """A request sent and not yet read."""

    def result(self) -> HttpResponse:
        """Reads the response (waiting for it if it has not arrived); raises what the
        request raised. Call once."""
        ...

    def cancel(self) -> None:
        """Drops the request unread and closes its connection."""
        ...


@dataclass(frozen=True, slots=True)
class FetchResponse:
    status_code: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


class CompletedResponse:
    """A request already answered, or already failed, when it was begun."""

    __slots__ = ("_error", "_response")

    def __init__(self, response: HttpResponse | None = None,
                 error: Exception | None = None) -> None:
        self._response = response
        self._error = error

    def result(self) -> HttpResponse:
        if self._error is not None:
            raise self._error
        assert self._response is not None
        return self._response

    def cancel(self) -> None:
        pass


def begin_get(client: HttpClient, url: str) -> PendingResponse:
    """Sends a GET for ``url`` now; ``result()`` reads its response. A client without
    ``begin_get`` of its own makes the whole request here. Never raises: a failure is
    raised by ``result()``."""
    begin = getattr(client, "begin_get", None)
    try:
        if begin is not None:
            pending: PendingResponse = begin(url)
            return pending
        return CompletedResponse(client.get(url))
    except Exception as exc:
        return CompletedResponse(error=exc)


def _origin_and_target(url: str) -> tuple[OriginKey, str]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    return (parts.scheme, parts.hostname, port), target


class KeepAliveHttpClient:
    """Kept-alive connections per origin, each used by one request at a time. A request
    that finds its kept-alive connection closed by the server is sent once more, on a new
    connection; a timeout, or a failure on a new connection, is not retried."""

    def __init__(self, timeout: float, *, clock: Callable[[], float] = time.monotonic,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self._timeout = timeout
        self._ssl_context = ssl_context  # for https origins; None: the system's defaults
        self._clock = clock
        # Idle connections per origin, with when their last request was sent.
        self._idle: dict[OriginKey, list[tuple[http.client.HTTPConnection, float]]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def get(self, url: str) -> FetchResponse:
        return self._request("GET", url, None, {})

    def post(self, url: str, *, content: bytes, headers: dict[str, str]) -> FetchResponse:
        return self._request("POST", url, content, headers)

    def begin_get(self, url: str) -> PendingResponse:
        """Sends a GET now on an idle kept-alive connection to the origin, or a new one,
        which stays out of the pool until its response is read. Never raises: failures
        are raised by ``result()``."""
        try:
            key, target = _origin_and_target(url)
            connection, reused = self._take(key)
        except Exception as exc:  # a URL http.client cannot use
            return CompletedResponse(error=exc)
        sent_at = self._clock()
        try:
            connection.request("GET", target)
        except Exception as exc:
            connection.close()
            if not (reused and isinstance(exc, CLOSED_CONNECTION_ERRORS)):
                return CompletedResponse(error=exc)
            try:
                return CompletedResponse(self._retry(key, "GET", target, None, {}))
            except Exception as retry_error:
                return CompletedResponse(error=retry_error)
        return _PendingGet(self, key, target, connection, reused, sent_at)

    def _take(self, key: OriginKey) -> tuple[http.client.HTTPConnection, bool]:
        """An idle connection to the origin young enough to reuse (``reused``), or a new
        one; idle ones too old to reuse are closed."""
        oldest_sent = self._clock() - KEEP_ALIVE_REUSE_SECONDS
        found: http.client.HTTPConnection | None = None
        stale: list[http.client.HTTPConnection] = []
        with self._lock:
            idle = self._idle.get(key)
            while idle and found is None:
                connection, sent_at = idle.pop()
                if sent_at >= oldest_sent:
                    found = connection
                else:
                    stale.append(connection)
        for connection in stale:
            connection.close()
        if found is not None:
            return found, True
        return self._connect(*key), False

    def _release(self, key: OriginKey, connection: http.client.HTTPConnection,
                 sent_at: float) -> None:
        """Back into the pool once its response is read, unless the pool is full."""
        with self._lock:
            if not self._closed:
                idle = self._idle.setdefault(key, [])
                if len(idle) < MAX_IDLE_PER_ORIGIN:
                    idle.append((connection, sent_at))
                    return
        connection.close()

    def _request(self, method: str, url: str, body: bytes | None,
                 headers: dict[str, str]) -> FetchResponse:
        key, target = _origin_and_target(url)
        connection, reused = self._take(key)
        try:
            return self._exchange(key, connection, method, target, body, headers)
        except CLOSED_CONNECTION_ERRORS:
            if not reused:
                raise
        return self._retry(key, method, target, body, headers)

    def _retry(self, key: OriginKey, method: str, target: str, body: bytes | None,
               headers: dict[str, str]) -> FetchResponse:
        """The request once more, on a new connection (never another pooled one, which
        the server may have closed as well)."""
        connection = self._connect(*key)
        return self._exchange(key, connection, method, target, body, headers)

    def _exchange(self, key: OriginKey, connection: http.client.HTTPConnection, method: str,
                  target: str, body: bytes | None, headers: dict[str, str]) -> FetchResponse:
        sent_at = self._clock()
        try:
            connection.request(method, target, body=body, headers=headers)
        except BaseException:
            connection.close()
            raise
        return self._read(key, connection, sent_at)

    def _read(self, key: OriginKey, connection: http.client.HTTPConnection,
              sent_at: float) -> FetchResponse:
        """The response on ``connection``, which then goes back to the pool (or is closed,
        when the server said so or the read failed)."""
        try:
            response = connection.getresponse()
            data = response.read()
        except BaseException:
            connection.close()
            raise
        if response.will_close:
            connection.close()
        else:
            self._release(key, connection, sent_at)
        return FetchResponse(response.status, data)

    def _connect(self, scheme: str, host: str, port: int) -> http.client.HTTPConnection:
        if scheme == "https":
            return http.client.HTTPSConnection(host, port, timeout=self._timeout,
                                               context=self._ssl_context)
        return http.client.HTTPConnection(host, port, timeout=self._timeout)

    def close(self) -> None:
        """Closes the idle connections; one in use is closed when its request ends."""
        with self._lock:
            self._closed = True
            idle = [connection for pool in self._idle.values() for connection, _ in pool]
            self._idle.clear()
        for connection in idle:
            connection.close()


class _PendingGet:
    """A GET sent on a connection the client lent out; ``result()`` reads the answer and
    returns the connection to the pool."""

    __slots__ = ("_client", "_connection", "_key", "_reused", "_sent_at", "_target")

    def __init__(self, client: KeepAliveHttpClient, key: OriginKey, target: str,
                 connection: http.client.HTTPConnection, reused: bool, sent_at: float) -> None:
        self._client = client
        self._key = key
        self._target = target
        self._connection: http.client.HTTPConnection | None = connection
        self._reused = reused
        self._sent_at = sent_at

    def result(self) -> HttpResponse:
        connection = self._connection
        if connection is None:
            raise RuntimeError("response already read or cancelled")
        self._connection = None
        try:
            return self._client._read(self._key, connection, self._sent_at)
        except CLOSED_CONNECTION_ERRORS:
            if not self._reused:
                raise
        return self._client._retry(self._key, "GET", self._target, None, {})

    def cancel(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()
