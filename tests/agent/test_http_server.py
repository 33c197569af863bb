"""The agent listener: idle without waking, and a shutdown that cannot hang."""

from __future__ import annotations

import socket
import threading

import httpx
import pytest

from tokenpath.agent import http_server
from tokenpath.agent.http_server import AgentHttpServer


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
