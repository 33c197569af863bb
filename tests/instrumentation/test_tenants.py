"""Tenants through the real gateway shim: from a header, a key table or a salted hash of
the key; the key itself reaches no span, record, metric or log."""

from __future__ import annotations

import logging

import httpx
import pytest
from fastapi import FastAPI
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.trace import SpanKind

from testkit.fakes.otel_sink import SpanSink
from tests.instrumentation.reference.support import run_async
from tokenpath import attributes as attr
from tokenpath import metric_names as M
from tokenpath.collector.assembler import AssembledTrace
from tokenpath.collector.limits import IngestLimits
from tokenpath.collector.mapping import map_calls
from tokenpath.collector.prometheus_sink import PrometheusSink
from tokenpath.collector.receivers.otlp_decode import decode_traces
from tokenpath.config import ConfigError
from tokenpath.instrumentation.gateway import GatewayConfig, GatewayInstrumentor
from tokenpath.instrumentation.tenants import (
    TENANT_HEADER_EXAMPLE,
    TenantConfig,
    TenantResolver,
)

MAPPED_KEY = "sk-live-acme-5f0c1d2e3f4a5b6c7d8e9f"
OTHER_KEY = "sk-live-stranger-0a1b2c3d4e5f60718293"
SALT = "tokenpath-test-salt-0123456789"


def _app(config: TenantConfig, sink: SpanSink) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat() -> dict[str, str]:
        return {"ok": "yes"}

    GatewayInstrumentor().instrument_app(app, tracer_provider=sink.provider,
                                         config=GatewayConfig(tenants=config))
    return app


def _call(app: FastAPI, headers: dict[str, str]) -> None:
    async def run() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            response = await client.post("/v1/chat/completions", headers=headers)
            assert response.status_code == 200

    run_async(run)


def _tenants(sink: SpanSink) -> list[object]:
    return [s.attributes.get(attr.TENANT) for s in sink.spans() if s.kind is SpanKind.SERVER]


CONFIG = TenantConfig(key_tenants={MAPPED_KEY: "acme"}, header=TENANT_HEADER_EXAMPLE,
                      hash_salt=SALT)


def test_tenant_from_key_table_then_header_then_salted_hash(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    sink = SpanSink()
    app = _app(CONFIG, sink)
    _call(app, {"x-tenant-id": "globex", "authorization": f"Bearer {MAPPED_KEY}"})
    _call(app, {"x-tenant-id": "team-blue", "authorization": f"Bearer {OTHER_KEY}"})
    _call(app, {"authorization": f"Bearer {OTHER_KEY}"})
    _call(app, {})
    first, second, third, fourth = _tenants(sink)
    # an authenticated key wins: a header cannot bill another tenant
    assert (first, second, fourth) == ("acme", "team-blue", None)
    assert isinstance(third, str) and third.startswith("key-") and len(third) == 16
    assert third == TenantResolver(CONFIG).resolve({"authorization": f"Bearer {OTHER_KEY}"})

    # through the collector: records and metrics carry the tenant, never the key
    request = encode_spans(sink.spans())
    spans = decode_traces(request, IngestLimits()).spans
    records = []
    for trace_id in {s.trace_id for s in spans}:
        records += map_calls(AssembledTrace(trace_id, [s for s in spans
                                                       if s.trace_id == trace_id], True))
    assert sorted(r.tenant or "" for r in records) == sorted(["acme", "team-blue", third, ""])
    prometheus = PrometheusSink()
    for record in records:
        prometheus.consume_record(record)
    exposition = prometheus.render()
    assert f'{M.LABEL_TENANT}="acme"' in exposition
    everything = " ".join([str(request), exposition, caplog.text,
                           *(str(r.to_json()) for r in records)])
    for key in (MAPPED_KEY, OTHER_KEY, SALT):
        assert key not in everything


def test_the_header_is_not_read_unless_configured() -> None:
    resolver = TenantResolver(TenantConfig(hash_salt=SALT))
    assert resolver.resolve({"x-tenant-id": "acme"}) is None
    assert resolver.resolve({"x-tenant-id": "acme", "authorization": f"Bearer {OTHER_KEY}"}
                            ).startswith("key-")


def test_without_a_salt_an_unknown_key_names_no_tenant() -> None:
    resolver = TenantResolver(TenantConfig(key_tenants={MAPPED_KEY: "acme"}))
    assert resolver.resolve({"authorization": f"Bearer {OTHER_KEY}"}) is None
    assert resolver.resolve({"authorization": f"bearer {MAPPED_KEY}"}) == "acme"
    assert MAPPED_KEY not in repr(resolver.config)


def test_a_bad_tenant_config_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"tenants\.hash_salt"):
        TenantConfig(hash_salt="short").validate()
    with pytest.raises(ConfigError, match=r"tenants\.keys"):
        TenantConfig(key_tenants={"k": ""}).validate()
