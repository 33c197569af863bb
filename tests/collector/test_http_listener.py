"""The collector's HTTP listener: uvicorn on a pre-bound socket, in a thread."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from tests.collector.conftest import ServiceFactory
from tokenpath.collector import http_app
from tokenpath.collector.config import CollectorConfig
from tokenpath.collector.http_app import HttpListener
from tokenpath.collector.service import CollectorService
from tokenpath.config import ConfigError
from tokenpath.tls import TlsConfig


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/ping")
    async def ping() -> dict[str, str]:
        return {"pong": "yes"}

    return app


def test_shutdown_wakes_the_server_loop_instead_of_waiting_for_its_next_tick(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The main loop sleeps until the next Date refresh; with that an hour away, only the
    # wake-up from request_exit() lets the thread finish within the join's 10 s.
    monkeypatch.setattr(http_app, "DATE_REFRESH_SECONDS", 3600.0)
    listener = HttpListener(_app(), "127.0.0.1", 0)
    listener.start()
    thread = listener._thread
    assert thread is not None
    response = httpx.get(f"{listener.url}/ping", timeout=5)
    assert response.json() == {"pong": "yes"}
    assert response.headers["date"]  # uvicorn's Date header is still set
    listener.shutdown()
    assert not thread.is_alive()


def test_shutdown_before_start_closes_the_socket() -> None:
    listener = HttpListener(_app(), "127.0.0.1", 0)
    listener.shutdown()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{listener.url}/ping", timeout=2)


def test_a_busy_grpc_port_fails_start_naming_the_key_and_leaves_nothing_running(
        make_service: ServiceFactory) -> None:
    first = make_service()
    assert first.grpc is not None
    second = CollectorService(CollectorConfig(http_port=0, grpc_port=first.grpc.port,
                                              store_path=":memory:"))
    with pytest.raises(ConfigError) as err:
        second.start()  # grpcio's SO_REUSEPORT default would have let it share the port
    assert err.value.key == "grpc"
    with pytest.raises(ConnectionRefusedError):  # its HTTP socket was closed again
        socket.create_connection(("127.0.0.1", second.http.port), timeout=2).close()


def test_a_server_that_dies_while_starting_fails_start_and_frees_its_port(
        tmp_path: Path) -> None:
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("not a certificate\n")
    # TlsConfig.validate() refuses these files; unvalidated, uvicorn fails in its thread.
    listener = HttpListener(_app(), "127.0.0.1", 0, TlsConfig(cert=str(not_pem),
                                                              key=str(not_pem)))
    with pytest.raises(RuntimeError, match="failed to start"):
        listener.start()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", listener.port), timeout=2).close()
    listener.shutdown()  # still safe
