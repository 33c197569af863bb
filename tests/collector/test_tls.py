"""TLS and mTLS on both listeners, with a CA made here and the real OTel exporters."""

from __future__ import annotations

import ssl
import subprocess
import time
from pathlib import Path

import grpc
import httpx
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter

from testkit.support.certs import CertFiles, make_certs
from testkit.support.otlp import PROTOBUF_HEADERS, export_request, request_span
from testkit.support.processes import free_port, run_cli, tokenpath_cmd
from tests.collector.conftest import ServiceFactory, wait_for
from tokenpath import attributes as A
from tokenpath.collector.config import CollectorConfig
from tokenpath.collector.receivers.grpc import TRACE_SERVICE
from tokenpath.collector.service import CollectorService
from tokenpath.config import ConfigError
from tokenpath.stages import StageId
from tokenpath.tls import ENV_TLS_CERT, ENV_TLS_KEY, TlsConfig


@pytest.fixture(autouse=True)
def _no_ca_bundle_override(monkeypatch: pytest.MonkeyPatch) -> None:
    """requests lets REQUESTS_CA_BUNDLE/CURL_CA_BUNDLE override a session's CA file (the
    OTel HTTP exporter's certificate_file); this machine sets them."""
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    return make_certs(tmp_path_factory.mktemp("certs"))


def _emit(exporter: SpanExporter, count: int) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tls-test")
    for _ in range(count):
        with tracer.start_as_current_span("request") as span:
            span.set_attribute(A.STAGE, StageId.ROUTER.value)
    provider.shutdown()


def _client_context(ca: Path, cert: CertFiles | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        context.load_cert_chain(str(cert.client_cert), str(cert.client_key))
    return context


def _grpc_export(endpoint: str, credentials: grpc.ChannelCredentials) -> None:
    body = export_request([request_span()]).SerializeToString()
    with grpc.secure_channel(endpoint, credentials) as channel:
        channel.unary_unary(f"/{TRACE_SERVICE}/Export")(body, timeout=5)


def test_tls_on_both_listeners(make_service: ServiceFactory, certs: CertFiles) -> None:
    service = make_service(tls=TlsConfig(str(certs.server_cert), str(certs.server_key)))
    assert service.http_url.startswith("https://")
    assert service.grpc_endpoint is not None
    _emit(HttpExporter(endpoint=f"{service.http_url}/v1/traces",
                       certificate_file=str(certs.ca)), 2)
    _emit(GrpcExporter(endpoint=service.grpc_endpoint, insecure=False,
                       credentials=grpc.ssl_channel_credentials(certs.ca.read_bytes())), 3)
    wait_for(lambda: service.stats.records_stored.value == 5)
    ok = httpx.get(f"{service.http_url}/healthz", verify=_client_context(certs.ca), timeout=5)
    assert ok.status_code == 200
    # A client that does not trust the server's CA is refused; plaintext gets nothing.
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{service.http_url}/healthz", verify=_client_context(certs.other_ca),
                  timeout=5)
    with pytest.raises(httpx.HTTPError):
        httpx.get(service.http_url.replace("https://", "http://") + "/healthz", timeout=5)
    with pytest.raises(grpc.RpcError) as err:
        _grpc_export(service.grpc_endpoint,
                     grpc.ssl_channel_credentials(certs.other_ca.read_bytes()))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]


def test_mutual_tls_requires_a_client_certificate(make_service: ServiceFactory,
                                                  certs: CertFiles) -> None:
    service: CollectorService = make_service(tls=TlsConfig(
        str(certs.server_cert), str(certs.server_key), client_ca=str(certs.ca)))
    assert service.grpc_endpoint is not None
    _emit(HttpExporter(endpoint=f"{service.http_url}/v1/traces",
                       certificate_file=str(certs.ca),
                       client_certificate_file=str(certs.client_cert),
                       client_key_file=str(certs.client_key)), 2)
    _emit(GrpcExporter(endpoint=service.grpc_endpoint, insecure=False,
                       credentials=grpc.ssl_channel_credentials(
                           certs.ca.read_bytes(), certs.client_key.read_bytes(),
                           certs.client_cert.read_bytes())), 2)
    wait_for(lambda: service.stats.records_stored.value == 4)
    with_cert = httpx.post(f"{service.http_url}/v1/traces", headers=PROTOBUF_HEADERS,
                           content=export_request([request_span()]).SerializeToString(),
                           verify=_client_context(certs.ca, certs), timeout=5)
    assert with_cert.status_code == 200
    # No client certificate: the handshake fails before any request is read.
    with pytest.raises(httpx.HTTPError):
        httpx.post(f"{service.http_url}/v1/traces", headers=PROTOBUF_HEADERS,
                   content=export_request([request_span()]).SerializeToString(),
                   verify=_client_context(certs.ca), timeout=5)
    with pytest.raises(grpc.RpcError) as err:
        _grpc_export(service.grpc_endpoint, grpc.ssl_channel_credentials(certs.ca.read_bytes()))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    wait_for(lambda: service.stats.records_stored.value == 5)


def test_tls_options_from_flags_env_and_file(certs: CertFiles, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    file = {"tls": {"cert": str(certs.server_cert), "key": str(certs.server_key),
                    "client_ca": str(certs.ca)}}
    cfg = CollectorConfig.from_sources(store=str(tmp_path / "s.db"), file=file)
    assert cfg.tls == TlsConfig(str(certs.server_cert), str(certs.server_key), str(certs.ca))
    # (the client's pair stands in for another server pair: the pair must match)
    monkeypatch.setenv(ENV_TLS_CERT, str(certs.client_cert))
    monkeypatch.setenv(ENV_TLS_KEY, str(certs.client_key))
    cfg = CollectorConfig.from_sources(store=str(tmp_path / "s.db"), file=file)
    assert cfg.tls.cert == str(certs.client_cert)  # env over file
    cfg = CollectorConfig.from_sources(store=str(tmp_path / "s.db"), file=file,
                                       tls_cert=str(certs.server_cert),
                                       tls_key=str(certs.server_key), tls_client_ca=None)
    assert cfg.tls.cert == str(certs.server_cert)  # flag over env
    monkeypatch.delenv(ENV_TLS_CERT)
    monkeypatch.delenv(ENV_TLS_KEY)
    with pytest.raises(ConfigError) as err:
        CollectorConfig.from_sources(store=str(tmp_path / "s.db"),
                                     tls_cert=str(certs.server_cert))
    assert err.value.key == "tls.key"
    with pytest.raises(ConfigError) as err:
        CollectorConfig.from_sources(store=str(tmp_path / "s.db"),
                                     file={"tls": {"cert": "/nonexistent.pem",
                                                   "key": str(certs.server_key)}})
    assert err.value.key == "tls.cert"
    with pytest.raises(ConfigError) as err:
        CollectorConfig.from_sources(store=str(tmp_path / "s.db"), file={"tls": {"ca": "x"}})
    assert err.value.key == "tls.ca"


def test_collector_cli_tls_flags(certs: CertFiles, tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        tokenpath_cmd("collector", "--http", f"127.0.0.1:{port}", "--grpc", "off",
                      "--store", str(tmp_path / "s.db"), "--tls-cert", str(certs.server_cert),
                      "--tls-key", str(certs.server_key), "--tls-client-ca", str(certs.ca)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        context = _client_context(certs.ca, certs)
        deadline = time.monotonic() + 30
        while True:
            try:
                response = httpx.get(f"https://127.0.0.1:{port}/healthz", verify=context,
                                     timeout=2)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.1)
        assert response.status_code == 200
        with pytest.raises(httpx.HTTPError):  # no client certificate
            httpx.get(f"https://127.0.0.1:{port}/healthz", verify=_client_context(certs.ca),
                      timeout=2)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    half = run_cli("collector", "--store", str(tmp_path / "s.db"), "--tls-cert",
                   str(certs.server_cert))
    assert half.returncode == 2
    assert "tls.key" in half.stderr


def test_files_that_cannot_be_loaded_fail_validation_naming_their_key(
        certs: CertFiles, tmp_path: Path) -> None:
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("-----BEGIN CERTIFICATE-----\nnot a cert\n-----END CERTIFICATE-----\n")
    cases = {
        "tls.cert": TlsConfig(cert=str(not_pem), key=str(certs.server_key)),
        # a key that is not the certificate's
        "tls.cert ": TlsConfig(cert=str(certs.server_cert), key=str(certs.client_key)),
        "tls.client_ca": TlsConfig(cert=str(certs.server_cert), key=str(certs.server_key),
                                   client_ca=str(not_pem)),
    }
    for expected, tls in cases.items():
        with pytest.raises(ConfigError) as err:
            tls.validate()
        assert err.value.key == expected.strip()
    # Valid files still pass.
    TlsConfig(cert=str(certs.server_cert), key=str(certs.server_key),
              client_ca=str(certs.ca)).validate()
