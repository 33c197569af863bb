"""Bearer auth on every listener but /healthz, checked before the body is read and never
logged; loopback by default; GenAI content never reaches the store, /metrics or logs."""

from __future__ import annotations

import secrets
import socket
import sqlite3
from pathlib import Path

import grpc
import httpx
import pytest
from fastapi.routing import APIRoute
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from starlette.routing import Route

from testkit.support.otlp import (
    PROTOBUF_HEADERS,
    export_request,
    make_span,
    new_trace_id,
    request_span,
    sample,
)
from testkit.support.processes import collector_process, poll_records
from tests.collector.conftest import ServiceFactory, wait_for
from tokenpath import attributes as A
from tokenpath import metric_names as M
from tokenpath.collector.config import CollectorConfig
from tokenpath.collector.http_app import HEALTH_PATH, PUBLIC_PATHS, UI_ASSET_PREFIX, UI_DIR
from tokenpath.collector.limits import IngestLimits
from tokenpath.collector.receivers.grpc import TRACE_SERVICE
from tokenpath.collector.receivers.otlp_decode import decode_traces
from tokenpath.stages import StageId

TOKEN = "tok-" + secrets.token_hex(16)


def _grpc_export(endpoint: str, token: str | None) -> object:
    body = export_request([request_span()]).SerializeToString()
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    with grpc.insecure_channel(endpoint) as channel:
        return channel.unary_unary(f"/{TRACE_SERVICE}/Export")(body, timeout=5,
                                                               metadata=metadata)


def test_every_http_route_but_healthz_needs_the_token(make_service: ServiceFactory) -> None:
    """Every route but /healthz and the UI's static shell (the page and its script and
    style files, which hold no data: a browser cannot send a bearer header when it
    navigates, so the page asks for the token and sends it on every /api call)."""
    service = make_service(auth_token=TOKEN)
    url = service.http_url
    routes = [(method.upper(), path) for path, item in service.app.openapi()["paths"].items()
              for method in item]
    routes += [("GET", route.path) for route in service.app.routes
               if isinstance(route, Route) and not isinstance(route, APIRoute)]
    assert ("POST", "/v1/traces") in routes and ("GET", "/metrics") in routes
    for method, path in [*routes, ("GET", "/no/such/path")]:
        if path in PUBLIC_PATHS or path.startswith(UI_ASSET_PREFIX):
            continue
        concrete = path.replace("{trace_id}", "0" * 32)
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN},
                        {"Authorization": f"Basic {TOKEN}"}):
            response = httpx.request(method, url + concrete, headers=headers, timeout=5)
            assert response.status_code == 401, (method, path, headers)
            assert response.headers["www-authenticate"].startswith("Bearer")
    assert httpx.get(url + HEALTH_PATH, timeout=5).status_code == 200
    shell = httpx.get(url + "/", timeout=5)
    assert shell.status_code == 200
    assert shell.text == (UI_DIR / "index.html").read_text(encoding="utf-8")  # static only
    authorized = {"Authorization": f"bearer {TOKEN}"}  # the scheme is case-insensitive
    assert httpx.get(url + "/metrics", headers=authorized, timeout=5).status_code == 200
    posted = httpx.post(url + "/v1/traces", headers={**authorized, **PROTOBUF_HEADERS},
                        content=export_request([request_span()]).SerializeToString(),
                        timeout=5)
    assert posted.status_code == 200


def test_auth_is_checked_before_the_body_is_read(make_service: ServiceFactory) -> None:
    """Headers announcing a 10 GB body, no token, and not one body byte sent: the 401
    arrives anyway, so the server answered without waiting for (or reading) the body."""
    service = make_service(auth_token=TOKEN)
    with socket.create_connection(("127.0.0.1", service.http.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/x-protobuf\r\n"
                     b"Content-Length: 10000000000\r\n\r\n")
        reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 401")
    assert service.stats.spans_received.total() == 0


def test_grpc_needs_the_token(make_service: ServiceFactory) -> None:
    service = make_service(auth_token=TOKEN)
    assert service.grpc_endpoint is not None
    for token in (None, "wrong"):
        with pytest.raises(grpc.RpcError) as err:
            _grpc_export(service.grpc_endpoint, token)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
    _grpc_export(service.grpc_endpoint, TOKEN)
    assert service.stats.requests_rejected[("otlp_grpc", "UNAUTHENTICATED")] == 2
    assert service.stats.spans_received["otlp_grpc"] == 1


def _emit(exporter: SpanExporter, attrs: dict[str, str] | None = None) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("security").start_as_current_span("request") as span:
        span.set_attribute(A.STAGE, StageId.ROUTER.value)
        for key, value in (attrs or {}).items():
            span.set_attribute(key, value)
    provider.shutdown()


def test_token_is_never_logged(tmp_path: Path) -> None:
    wrong = "wrong-" + secrets.token_hex(16)
    with collector_process(tmp_path / "store.db", "--log-level", "debug",
                           env={"TOKENPATH_AUTH_TOKEN": TOKEN}) as collector:
        for token in (wrong, TOKEN):  # a failure and a success on each listener
            headers = {"Authorization": f"Bearer {token}"}
            _emit(HttpExporter(endpoint=f"{collector.http_url}/v1/traces", headers=headers,
                               timeout=2))
            _emit(GrpcExporter(endpoint=collector.grpc_endpoint, insecure=True,
                               headers={"authorization": f"Bearer {token}"}, timeout=2))
            httpx.get(f"{collector.http_url}/metrics", headers=headers, timeout=5)
        poll_records_with_token(collector.http_url, 2)
        output = collector.stop()
    assert "DEBUG" in output  # debug logging was on
    assert TOKEN not in output and wrong not in output
    assert TOKEN not in repr(CollectorConfig(auth_token=TOKEN))


def poll_records_with_token(url: str, expected: int) -> None:
    def done() -> bool:
        got = httpx.get(f"{url}/api/requests", timeout=5,
                        headers={"Authorization": f"Bearer {TOKEN}"}).json()
        return len(got) >= expected

    wait_for(done, timeout=30)


def test_default_bind_is_loopback(make_service: ServiceFactory,
                                  monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for env in ("TOKENPATH_COLLECTOR_HTTP", "TOKENPATH_COLLECTOR_GRPC"):
        monkeypatch.delenv(env, raising=False)
    defaults = CollectorConfig.from_sources(store=str(tmp_path / "s.db"))
    assert (defaults.http_host, defaults.grpc_host) == ("127.0.0.1", "127.0.0.1")
    assert CollectorConfig().http_host == CollectorConfig().grpc_host == "127.0.0.1"
    service = make_service()  # default hosts, port 0
    assert service.http_url.startswith("http://127.0.0.1:")
    assert service.grpc_endpoint is not None and service.grpc_endpoint.startswith("127.0.0.1:")
    with socket.create_connection(("127.0.0.1", service.http.port), timeout=5):
        pass


PROMPT = "SECRET-PROMPT-" + secrets.token_hex(8)
COMPLETION = "SECRET-COMPLETION-" + secrets.token_hex(8)


def _content_span(trace_id: bytes) -> object:
    return make_span(
        trace_id, name="chat",
        attrs={A.STAGE: StageId.ROUTER.value, A.GEN_AI_REQUEST_MODEL: "m",
               "gen_ai.prompt.0.content": PROMPT, "gen_ai.completion.0.content": COMPLETION,
               "gen_ai.input.messages": f'[{{"role":"user","content":"{PROMPT}"}}]',
               "gen_ai.system_instructions": PROMPT},
        events=[("gen_ai.user.message", {"content": PROMPT}),
                ("gen_ai.choice", {"message": COMPLETION}),
                ("gen_ai.content.prompt", {"gen_ai.prompt": PROMPT}),
                (A.STAGE_EVENT, {A.STAGE: StageId.KV_CACHE_LOOKUP.value, A.STAGE_SECONDS: 0.01,
                                 "gen_ai.prompt": PROMPT})])


def test_genai_content_never_reaches_store_metrics_or_logs(tmp_path: Path) -> None:
    store = tmp_path / "store.db"
    trace_id = new_trace_id()
    body = export_request([_content_span(trace_id)]).SerializeToString()  # type: ignore[list-item]
    with collector_process(store, "--log-level", "debug") as collector:
        response = httpx.post(f"{collector.http_url}/v1/traces", content=body,
                              headers=PROTOBUF_HEADERS, timeout=5)
        assert response.status_code == 200
        _grpc_export_raw(collector.grpc_endpoint, export_request(
            [_content_span(new_trace_id())]).SerializeToString())  # type: ignore[list-item]
        records = poll_records(collector.http_url, 2)
        metrics = httpx.get(f"{collector.http_url}/metrics", timeout=5).text
        summary = httpx.get(f"{collector.http_url}/api/summary", timeout=5).text
        output = collector.stop()
    assert {r["trace_id"] for r in records} >= {trace_id.hex()}
    assert sample(metrics, M.ATTRIBUTES_DROPPED.series, reason="genai_content") == 2 * 5
    assert sample(metrics, M.SPAN_EVENTS_DROPPED.series, reason="genai_content") == 2 * 3
    stored = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("store"))
    with sqlite3.connect(store) as db:
        rows = " ".join(str(row) for table in ("records", "names")
                        for row in db.execute(f"SELECT * FROM {table}"))
    for text in (str(records), metrics, summary, output, rows):
        assert PROMPT not in text and COMPLETION not in text
    assert PROMPT.encode() not in stored and COMPLETION.encode() not in stored
    assert "SECRET" not in output


def _grpc_export_raw(endpoint: str, body: bytes) -> None:
    with grpc.insecure_channel(endpoint) as channel:
        channel.unary_unary(f"/{TRACE_SERVICE}/Export")(body, timeout=5)


def test_content_is_kept_only_when_opted_in() -> None:
    request = export_request([_content_span(new_trace_id())])  # type: ignore[list-item]
    dropped = decode_traces(request, IngestLimits())
    (span,) = dropped.spans
    assert not any(k.startswith(A.GEN_AI_CONTENT_PREFIXES) for k in span.attributes)
    assert [e.name for e in span.events] == [A.STAGE_EVENT]
    assert "gen_ai.prompt" not in span.events[0].attributes
    kept = decode_traces(request, IngestLimits(keep_content_attributes=True))
    assert kept.spans[0].attributes["gen_ai.prompt.0.content"] == PROMPT
    assert len(kept.spans[0].events) == 4
    assert kept.content_attributes_dropped == 0


def test_content_keys_are_dropped_on_every_span_of_a_request() -> None:
    # The decoder checks each distinct key once per request; a content key seen again on
    # a later span must still be dropped and counted.
    trace_id = new_trace_id()
    request = export_request([_content_span(trace_id), _content_span(trace_id)])  # type: ignore[list-item]
    decoded = decode_traces(request, IngestLimits())
    assert len(decoded.spans) == 2
    for span in decoded.spans:
        assert not any(k.startswith(A.GEN_AI_CONTENT_PREFIXES) for k in span.attributes)
        assert "gen_ai.prompt" not in span.events[0].attributes
        assert span.attributes[A.GEN_AI_REQUEST_MODEL] == "m"
    assert decoded.content_attributes_dropped == 2 * 5


def test_keep_content_attributes_is_a_config_key(tmp_path: Path) -> None:
    cfg = CollectorConfig.from_sources(store=str(tmp_path / "s.db"),
                                       file={"limits": {"keep_content_attributes": True}})
    assert cfg.limits.keep_content_attributes is True
    assert CollectorConfig().limits.keep_content_attributes is False
