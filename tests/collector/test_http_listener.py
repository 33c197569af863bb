"""The collector's HTTP listener: uvicorn on a pre-bound socket, in a thread."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI

from tokenpath.collector import http_app
from tokenpath.collector.http_app import HttpListener


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
