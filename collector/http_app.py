"""The collector's HTTP listener: OTLP/HTTP, /metrics, the JSON API, /healthz and the UI.

Auth (when a token is configured) is a pure ASGI middleware, so it runs before any body
is read; /healthz stays open for probes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import Body, FastAPI, HTTPException, Query, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from tokenpath import metric_names as M
from tokenpath import views
from tokenpath.auth import bearer_matches
from tokenpath.collector import api_aggregate, api_views
from tokenpath.collector.cost.chargeback import IdlePolicy
from tokenpath.collector.cost.prices import PriceSheet
from tokenpath.collector.cost.whatif_overview import WhatIfWindow
from tokenpath.collector.node_metrics import (
    NodeMetricsState,
    kv_measured_causes,
    nic_last_mile,
)
from tokenpath.collector.receivers.http import (
    OtlpFastPath,
    method_not_allowed,
    otlp_endpoints,
    otlp_router,
)
from tokenpath.collector.receivers.ingest import OtlpIngest
from tokenpath.collector.stats import CollectorStats
from tokenpath.collector.store.base import Store
from tokenpath.collector.whatif_view import WhatIfRequest, whatif_page_view, whatif_view
from tokenpath.config import ConfigError, parse_duration
from tokenpath.endpoints import host_port
from tokenpath.last_mile import DEFAULT_PACKETS_PER_TOKEN_THRESHOLD
from tokenpath.query import Window
from tokenpath.slo import SloConfig
from tokenpath.tls import TlsConfig

log = logging.getLogger(__name__)

HEALTH_PATH = "/healthz"
UI_ASSET_PREFIX = "/ui/"
# The UI shell holds no data (every figure comes from /api with the token), so the page
# and its static assets load without auth; the page then asks for the token.
PUBLIC_PATHS = frozenset({HEALTH_PATH, "/"})
UI_MEDIA_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml",
                  ".html": "text/html"}
UI_DIR = Path(__file__).parent / "ui" / "static"


class BearerAuthMiddleware:
    """401 unless ``Authorization: Bearer <token>``; checked before the body is read."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self._app = app
        self._token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if (scope["type"] not in ("http", "websocket") or path in PUBLIC_PATHS
                or path.startswith(UI_ASSET_PREFIX)):
            await self._app(scope, receive, send)
            return
        header = None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                header = value.decode("latin-1")
                break
        if bearer_matches(header, self._token):
            await self._app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await send({
            "type": "http.response.start",
            "status": 401,
            "headers": [(b"content-type", b"application/json"),
                        (b"www-authenticate", b'Bearer realm="tokenpath"')],
        })
        await send({"type": "http.response.body", "body": b'{"detail":"unauthorized"}'})


def _since(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return time.time() - parse_duration(value, "since")
    except ConfigError as exc:
        raise HTTPException(400, str(exc)) from exc


def build_app(
    ingest: OtlpIngest,
    store: Store,
    metrics_text: Callable[[], str],
    stats: CollectorStats,
    prices: PriceSheet,
    auth_token: str | None = None,
    forward_records: str | None = None,
    node_metrics: NodeMetricsState | None = None,
    slo: SloConfig | None = None,
) -> FastAPI:
    """``slo``: the collector's SLO classes (their objectives in /api/summary)."""
    app = FastAPI(title="tokenpath collector", docs_url=None, redoc_url=None,
                  openapi_url="/api/openapi.json")
    endpoints = otlp_endpoints(ingest, stats)
    app.include_router(otlp_router(endpoints))

    @app.get(HEALTH_PATH)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(metrics_text(), media_type=CONTENT_TYPE_LATEST)

    api_aggregate.register(app, store)

    @app.get("/api/requests")
    def requests(limit: int = Query(api_views.DEFAULT_API_LIMIT, ge=1,
                                    le=api_views.MAX_API_LIMIT),
                 since: str | None = None,
                 until: float | None = None) -> list[dict[str, Any]]:
        if until is not None and not math.isfinite(until):
            raise HTTPException(400, f"until: must be a finite unix time, not {until!r}")
        return [r.to_json() for r in store.records(limit=limit, since_unix=_since(since),
                                                   until_unix=until)]

    @app.get("/api/requests/{record_id}")
    def request(record_id: str) -> dict[str, Any]:
        record = store.record(record_id.lower())
        if record is None:
            raise HTTPException(404, f"no request with record or trace id {record_id}")
        return record.to_json()

    @app.get("/api/traces/{trace_id}")
    def trace_calls(trace_id: str) -> list[dict[str, Any]]:
        """The workflow view: every LLM call of one trace, oldest first."""
        records = store.records_of_trace(trace_id.lower())
        if not records:
            raise HTTPException(404, f"no request with trace id {trace_id}")
        return [r.to_json() for r in records]

    @app.get("/api/summary")
    def summary(since: str | None = None) -> dict[str, Any]:
        report = views.report_view(store, Window(_since(since)), slo)
        # Which records these are: a replica holds the records it priced; with
        # forward_records the ones it maps are priced (and shown) elsewhere.
        return {**report.to_json(), "collector": {"forward_records": forward_records}}

    @app.get("/api/chargeback")
    def chargeback_view(since: str | None = None,
                        idle: IdlePolicy = IdlePolicy.PROPORTIONAL) -> dict[str, Any]:
        """Dollars by tenant: attributed plus idle by ``idle`` (collector/cost/chargeback)."""
        window = Window(_since(since))
        rows = views.chargeback_view(store, window, idle)
        return {"idle_policy": idle.value, "rows": [r.to_json() for r in rows],
                "total_dollars": sum(r.total_dollars for r in rows),
                "window": views.window_json(store, window)}

    @app.get("/api/stages")
    def stages() -> list[dict[str, Any]]:
        return api_views.stages_view()

    @app.get("/api/timeseries")
    def timeseries(since: str | None = None,
                   buckets: int = Query(api_views.DEFAULT_TIMESERIES_BUCKETS, ge=1,
                                        le=api_views.MAX_TIMESERIES_BUCKETS)) -> dict[str, Any]:
        return views.timeseries_view(store, Window(_since(since)), buckets)

    @app.get("/api/leaks")
    def leaks(since: str | None = None, limit: int = Query(api_views.DEFAULT_LEAK_LIMIT, ge=1,
                                                            le=1000),
              long_context_tokens: int = Query(api_views.DEFAULT_LONG_CONTEXT_TOKENS, ge=1),
              packets_per_token_threshold: float = Query(
                  DEFAULT_PACKETS_PER_TOKEN_THRESHOLD, gt=0, le=1000)) -> dict[str, Any]:
        view = views.leaks_view(store, Window(_since(since)), limit, long_context_tokens,
                                packets_per_token_threshold=packets_per_token_threshold,
                                network_dollars_per_byte=prices.network_dollars_per_byte)
        view["last_mile"]["nodes"] = [] if node_metrics is None else nic_last_mile(
            node_metrics, M.NODE_NET_TX_BYTES.name, M.NODE_NET_TX_PACKETS.name,
            M.LABEL_DEVICE)
        # What the engines' KV-cache events measure (node agents with --kv-events), beside
        # the causes inferred from the records: this collector's agents only.
        view["cache"]["measured"] = [] if node_metrics is None else kv_measured_causes(
            node_metrics, M.KV_RECOMPUTED_TOKENS.name, M.LABEL_ENGINE, M.LABEL_MODEL,
            M.LABEL_CAUSE, view["cache"]["prefill_dollars_per_computed_token"])
        return view

    @app.post("/api/whatif")
    def whatif(body: dict[str, Any] = Body(default_factory=dict),
               since: str | None = None, until: float | None = None) -> dict[str, Any]:
        request = WhatIfRequest.from_json(body)
        window = WhatIfWindow.resolve(since, until)
        sample = views.whatif_sample(store, Window(window.since_unix, window.until_unix))
        return {**whatif_view(sample.records, prices, request, window),
                "sample": sample.to_json()}

    @app.get("/api/whatif")
    def whatif_page(since: str | None = None, until: float | None = None) -> dict[str, Any]:
        """The what-if page's opening projections (collector/whatif_view.py)."""
        window = WhatIfWindow.resolve(since, until)
        sample = views.whatif_sample(store, Window(window.since_unix, window.until_unix))
        return {**whatif_page_view(sample.records, prices, window), "sample": sample.to_json()}

    @app.get(UI_ASSET_PREFIX + "{name}")
    def ui_asset(name: str) -> Response:
        path = UI_DIR / name
        media_type = UI_MEDIA_TYPES.get(path.suffix)
        if media_type is None or "/" in name or name.startswith(".") or not path.is_file():
            raise HTTPException(404, "no such asset")
        return Response(path.read_bytes(), media_type=media_type,
                        headers={"cache-control": "no-cache"})

    @app.get("/", response_class=HTMLResponse)
    def index() -> Response:
        page = UI_DIR / "index.html"
        if page.is_file():
            return HTMLResponse(page.read_text(encoding="utf-8"))
        return HTMLResponse(
            "<!doctype html><title>tokenpath</title><h1>tokenpath collector</h1>"
            "<p><a href='/api/summary'>summary</a> · <a href='/api/requests'>requests</a> · "
            "<a href='/metrics'>metrics</a></p>"
        )

    @app.exception_handler(ConfigError)
    async def config_error(_: Any, exc: ConfigError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 405:
            answer = method_not_allowed(request, (exc.headers or {}).get("Allow"))
            if answer is not None:
                return answer
        return await http_exception_handler(request, exc)

    app.add_middleware(OtlpFastPath, endpoints=endpoints)
    if auth_token:  # added last, so it runs first: before the OTLP fast path too
        app.add_middleware(BearerAuthMiddleware, token=auth_token)
    return app


def bind_socket(host: str, port: int, key: str) -> socket.socket:
    """A listening socket, so the port is known (and a busy port reported) at start."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(key, f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


# uvicorn refreshes its cached Date header once a second; its own main loop wakes ten
# times a second to do that and to notice a shutdown request.
DATE_REFRESH_SECONDS = 1.0
UVICORN_TICKS_PER_DATE_REFRESH = 10


class QuietServer(uvicorn.Server):
    """uvicorn's server, waking once a second instead of ten times when idle.

    uvicorn's ``main_loop`` sleeps 0.1 s between ``on_tick`` calls, which refresh the Date
    header every tenth call and check ``should_exit``. Here the loop sleeps until the next
    Date refresh, or until :meth:`request_exit` wakes it, so shutdown stays immediate. An
    idle collector's HTTP thread then wakes once a second: a wake-up costs 2 to 4 ms of
    CPU on the VMs this was measured on (docs/performance.md)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exit: asyncio.Event | None = None

    async def main_loop(self) -> None:
        self._loop = asyncio.get_running_loop()
        exit_requested = self._exit = asyncio.Event()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            # Every pass is a Date refresh tick for on_tick (counter % 10 == 0).
            counter = (counter + UVICORN_TICKS_PER_DATE_REFRESH) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(exit_requested.wait(), DATE_REFRESH_SECONDS)
            should_exit = await self.on_tick(counter)

    def request_exit(self) -> None:
        """Ask the server to stop, from any thread."""
        self.should_exit = True
        loop, exit_requested = self._loop, self._exit
        if loop is not None and exit_requested is not None:
            with contextlib.suppress(RuntimeError):  # the loop has already closed
                loop.call_soon_threadsafe(exit_requested.set)


class HttpListener:
    """Runs uvicorn on a pre-bound socket in a background thread."""

    def __init__(self, app: ASGIApp, host: str, port: int, tls: TlsConfig | None = None) -> None:
        self._sock = bind_socket(host, port, "http")
        self.host = host
        self.port = self._sock.getsockname()[1]
        self._scheme = "https" if tls is not None and tls.enabled else "http"
        config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False,
                                timeout_graceful_shutdown=2,
                                **(tls.uvicorn_options() if tls is not None else {}))
        self._server = QuietServer(config)
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

    @property
    def url(self) -> str:
        return f"{self._scheme}://{host_port(self.host, self.port)}"

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._serve, name="tokenpath-http",
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and self._thread.is_alive():
            if time.monotonic() > deadline:
                raise RuntimeError("HTTP listener did not start within 10 s")
            time.sleep(0.01)
        if not self._server.started:  # the server thread ended
            self._thread = None
            self._sock.close()
            raise RuntimeError(f"HTTP listener on {self.url} failed to start: "
                               f"{self._failure!r}") from self._failure

    def _serve(self) -> None:
        try:
            self._server.run(sockets=[self._sock])
        except BaseException as exc:  # kept for start(); logged for a failure after it
            self._failure = exc
            log.exception("HTTP listener on %s stopped", self.url)

    def shutdown(self) -> None:
        if self._thread is None:
            self._sock.close()
            return
        self._server.request_exit()
        self._thread.join(timeout=10)
        self._thread = None
        self._sock.close()
