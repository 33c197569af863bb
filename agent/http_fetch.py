"""A small keep-alive HTTP client on ``http.client`` for the agent's hot path.

The agent makes a few requests per second forever (engine /metrics pages, OTLP pushes),
so per-request CPU matters: on the bench machine an ``httpx.Client`` GET of a vLLM page
cost ~1.9 ms of CPU against ~0.6 ms here (see docs/agent.md). Anything with the same
``get``/``post``/``close`` shape can be injected instead, ``httpx.Client`` included.
"""

from __future__ import annotations

import http.client
import threading
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit


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


@dataclass(frozen=True, slots=True)
class FetchResponse:
    status_code: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


class KeepAliveHttpClient:
    """One persistent connection per origin; a broken connection is reopened once."""

    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        self._connections: dict[tuple[str, str, int], http.client.HTTPConnection] = {}
        self._lock = threading.Lock()

    def get(self, url: str) -> FetchResponse:
        return self._request("GET", url, None, {})

    def post(self, url: str, *, content: bytes, headers: dict[str, str]) -> FetchResponse:
        return self._request("POST", url, content, headers)

    def _request(self, method: str, url: str, body: bytes | None,
                 headers: dict[str, str]) -> FetchResponse:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        key = (parts.scheme, parts.hostname, port)
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        with self._lock:
            for attempt in (0, 1):
                connection = self._connections.get(key)
                fresh = connection is None
                if connection is None:
                    connection = self._connect(*key)
                    self._connections[key] = connection
                try:
                    connection.request(method, target, body=body, headers=headers)
                    response = connection.getresponse()
                    data = response.read()
                except (OSError, http.client.HTTPException):
                    connection.close()
                    del self._connections[key]
                    if fresh or attempt == 1:
                        raise
                    continue  # a kept-alive connection the server had closed: retry once
                if response.will_close:
                    connection.close()
                    del self._connections[key]
                return FetchResponse(response.status, data)
        raise AssertionError("unreachable")

    def _connect(self, scheme: str, host: str, port: int) -> http.client.HTTPConnection:
        if scheme == "https":
            return http.client.HTTPSConnection(host, port, timeout=self._timeout)
        return http.client.HTTPConnection(host, port, timeout=self._timeout)

    def close(self) -> None:
        with self._lock:
            for connection in self._connections.values():
                connection.close()
            self._connections.clear()
