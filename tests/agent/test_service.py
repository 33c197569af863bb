"""AgentService end to end in-process: /metrics, auth, OTLP push, config, no GPU."""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from testkit.fakes.engine_pages import render_sglang, render_vllm
from testkit.fakes.fake_nvml import FakeGpu, FakeNvml
from tests.agent.conftest import PageServer
from tokenpath import metric_names as mn
from tokenpath.agent.config import ENV_INTERVAL, ENV_LISTEN, ENV_NODE, AgentConfig
from tokenpath.agent.service import AgentService, load_pynvml
from tokenpath.attributes import NODE
from tokenpath.config import ConfigError
from tokenpath.tls import TlsConfig

TOKEN = "s3cret-token"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.fixture
def service(page_server: PageServer, dead_url: str) -> Iterator[AgentService]:
    page_server.pages["/vllm"] = render_vllm()
    page_server.pages["/sglang"] = render_sglang()
    config = AgentConfig(
        listen="127.0.0.1:0", interval_seconds=60.0, node="node-a",
        engine_metrics_urls=(page_server.url("/vllm"), page_server.url("/sglang"), dead_url),
    )
    agent = AgentService(config, nvml=FakeNvml([FakeGpu(), FakeGpu(failing=True)]),
                         auth_token=TOKEN)
    agent.start()
    yield agent
    agent.shutdown()


def test_metrics_endpoint_serves_every_source_and_requires_the_token(
        service: AgentService) -> None:
    url = f"http://127.0.0.1:{service.listen_port}"
    assert httpx.get(url + "/metrics").status_code == 401
    assert httpx.get(url + "/metrics",
                     headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(url + "/healthz").status_code == 200
    assert httpx.post(url + "/metrics").status_code == 405
    response = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200
    got = samples(response.text)
    assert got[(mn.AGENT_NVML_UP.series, ())] == 1.0
    assert got[(mn.GPU_UTILIZATION.series, (("gpu", "0"),))] == 0.5
    assert got[(mn.AGENT_SCRAPE_ERRORS.series, (("source", "nvml:gpu1"),))] == 1.0
    assert got[(mn.ENGINE_PREFIX_HIT_TOKENS.series,
                (("engine", "vllm"), ("model", "tiny-llama")))] == 2048
    assert got[(mn.ENGINE_REQUESTS_WAITING.series,
                (("engine", "sglang"), ("model", "meta-llama/Llama-3.1-8B-Instruct")))] == 2
    assert any(name == mn.NODE_NET_RX_BYTES.series for name, _ in got)
    dead = [labels for name, labels in got
            if name == mn.AGENT_SCRAPE_ERRORS.series and labels[0][1].startswith("engine:")]
    assert len(dead) == 1


def test_agent_never_registers_on_the_global_registry(service: AgentService) -> None:
    assert REGISTRY.get_sample_value(mn.AGENT_NVML_UP.series) is None
    assert service.registry.get_sample_value(mn.AGENT_NVML_UP.series) == 1.0


def test_shutdown_is_idempotent(page_server: PageServer) -> None:
    agent = AgentService(AgentConfig(listen="127.0.0.1:0", node="n"), nvml=FakeNvml())
    agent.start()
    agent.shutdown()
    agent.shutdown()


def test_real_pynvml_without_a_gpu_reports_nvml_up_zero() -> None:
    pynvml = load_pynvml()
    assert pynvml is not None
    agent = AgentService(AgentConfig(listen="127.0.0.1:0", node="n"))
    try:
        snapshot = agent.poll_once()
    finally:
        agent.shutdown()
    if agent.nvml_sampler.init_error is None:
        pytest.skip("this machine has a working NVIDIA driver")
    assert snapshot.get(mn.AGENT_NVML_UP) == 0.0
    assert mn.NODE_NET_RX_BYTES in snapshot.points


def test_otlp_push_reaches_a_real_http_server_as_protobuf(page_server: PageServer) -> None:
    config = AgentConfig(listen="127.0.0.1:0", node="gpu-node-7", interval_seconds=0.1,
                         push_interval_seconds=0.1, collector_url=page_server.base_url)
    gpus = [FakeGpu(nvlink_tx_kib=10)]
    agent = AgentService(config, nvml=FakeNvml(gpus), auth_token=TOKEN)
    agent.start(serve=False)
    deadline = time.monotonic() + 10
    while len(page_server.posts) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    agent.shutdown()
    assert len(page_server.posts) >= 2
    path, headers, body = page_server.posts[-1]
    assert path == "/v1/metrics"
    assert headers["Content-Type"] == "application/x-protobuf"
    assert headers["Authorization"] == f"Bearer {TOKEN}"
    request = ExportMetricsServiceRequest()
    request.ParseFromString(body)
    resource_metrics = request.resource_metrics[0]
    resource = {kv.key: kv.value.string_value for kv in resource_metrics.resource.attributes}
    assert resource[NODE] == "gpu-node-7"
    metrics = {m.name: m for m in resource_metrics.scope_metrics[0].metrics}
    nvlink = metrics[mn.GPU_NVLINK_TX.name]
    assert nvlink.sum.is_monotonic
    assert nvlink.sum.data_points[0].as_double == 10 * 1024
    assert {kv.key: kv.value.string_value
            for kv in nvlink.sum.data_points[0].attributes} == {"gpu": "0"}
    util = metrics[mn.GPU_UTILIZATION.name]
    assert util.gauge.data_points[0].as_double == 0.5
    assert metrics[mn.AGENT_NVML_UP.name].gauge.data_points[0].as_double == 1.0
    assert agent.pusher is not None and agent.pusher.failed == 0


def test_push_interval_is_honoured_and_shutdown_flushes_the_newest_poll(
        page_server: PageServer) -> None:
    config = AgentConfig(listen="127.0.0.1:0", node="n", interval_seconds=0.05,
                         push_interval_seconds=3600.0, collector_url=page_server.base_url)
    agent = AgentService(config, nvml=FakeNvml())
    agent.start(serve=False)
    time.sleep(0.5)  # several polls, no push due
    agent.shutdown()
    assert len(page_server.posts) == 2  # the first poll at start, the newest at shutdown
    request = ExportMetricsServiceRequest()
    request.ParseFromString(page_server.posts[-1][2])
    metric = request.resource_metrics[0].scope_metrics[0].metrics[0]
    points = metric.gauge.data_points or metric.sum.data_points
    assert agent.latest is not None
    assert points[0].time_unix_nano == agent.latest.taken_unix_nano


def test_failed_push_is_counted_and_never_stops_polling(dead_url: str) -> None:
    collector = dead_url.removesuffix("/metrics")
    config = AgentConfig(listen="127.0.0.1:0", node="n", collector_url=collector)
    agent = AgentService(config, nvml=FakeNvml())
    agent.start(serve=False)
    pusher = agent.pusher
    assert pusher is not None
    deadline = time.monotonic() + 10
    while pusher.failed < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    snapshot = agent.poll_once()
    agent.shutdown()
    assert snapshot.get(mn.AGENT_OTLP_PUSH_ERRORS) >= 1  # type: ignore[operator]


# -- config ------------------------------------------------------------------------------

def test_precedence_argument_over_env_over_file_over_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    file_values = {"agent": {"listen": "127.0.0.1:1111", "interval": "5s", "node": "file-node",
                             "engine_metrics": ["http://a:1/metrics"]}}
    monkeypatch.setenv(ENV_LISTEN, "127.0.0.1:2222")
    monkeypatch.setenv(ENV_INTERVAL, "2")
    config = AgentConfig.from_sources(listen="127.0.0.1:3333", file_values=file_values)
    assert config.listen == "127.0.0.1:3333"  # argument
    assert config.interval_seconds == 2.0  # env
    assert config.node == "file-node"  # file
    assert config.engine_metrics_urls == ("http://a:1/metrics",)
    assert config.collector_url is None  # default
    monkeypatch.setenv(ENV_NODE, "env-node")
    assert AgentConfig.from_sources(file_values=file_values).node == "env-node"
    monkeypatch.delenv(ENV_LISTEN)
    monkeypatch.delenv(ENV_INTERVAL)
    monkeypatch.delenv(ENV_NODE)
    assert AgentConfig.from_sources().listen == "127.0.0.1:9400"
    assert AgentConfig.from_sources().node == os.uname().nodename
    monkeypatch.setenv("NODE_NAME", "k8s-node")  # downward API, below everything else
    assert AgentConfig.from_sources().node == "k8s-node"
    assert AgentConfig.from_sources(file_values=file_values).node == "file-node"


@pytest.mark.parametrize(("kwargs", "file_values", "key"), [
    ({"listen": "nonsense"}, None, "listen"),
    ({"collector_url": "ftp://x"}, None, "collector"),
    ({"interval": "0"}, None, "interval"),
    ({"interval": "soon"}, None, "interval"),
    ({"engine_metrics_urls": ["localhost:8000/metrics"]}, None, "engine_metrics"),
    ({}, {"agent": {"max_models": 0}}, "max_models"),
    ({}, {"agent": {"nic_source": "carrier-pigeon"}}, "nic_source"),
    ({}, {"agent": {"nic_exclude": "("}}, "nic_exclude"),
    ({}, {"agent": {"bogus": 1}}, "bogus"),
    ({}, {"agent": {"engine_interval": "inf"}}, "engine_interval"),
    ({}, {"agent": {"push_interval": 0}}, "push_interval"),
    # A file without an agent: section holds the agent's keys at the top level.
    ({}, {"listen": "127.0.0.1:5555", "intreval": "30s"}, "intreval"),
    # Wrong types are refused, not coerced (2.9 -> 2, true -> 1 s).
    ({}, {"agent": {"max_devices": 2.9}}, "max_devices"),
    ({}, {"agent": {"max_models": 4.0}}, "max_models"),
    ({}, {"agent": {"max_sources": True}}, "max_sources"),
    ({}, {"max_devices": True}, "max_devices"),
    ({}, {"agent": {"interval": True}}, "interval"),
    ({}, {"engine_timeout": True}, "engine_timeout"),
    ({}, {"agent": {"engine_interval": True}}, "engine_interval"),
    ({}, {"agent": {"push_timeout": True}}, "push_timeout"),
    ({}, {"agent": {"push_interval": True}}, "push_interval"),
    ({}, {"agent": {"nvml_retry": True}}, "nvml_retry"),
])
def test_validate_names_the_key(kwargs: dict[str, object], file_values: dict[str, object] | None,
                                key: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        AgentConfig.from_sources(file_values=file_values, **kwargs)  # type: ignore[arg-type]
    assert excinfo.value.key == key


def test_config_file_is_read_from_yaml(tmp_path: Path) -> None:
    from tokenpath.config import load_config_file

    path = tmp_path / "tokenpath.yaml"
    path.write_text("agent:\n  interval: 500ms\n  collector: http://127.0.0.1:4318\n")
    config = AgentConfig.from_sources(file_values=load_config_file(path))
    assert config.interval_seconds == 0.5
    assert config.collector_url == "http://127.0.0.1:4318"


def test_sysfs_root_from_the_config_file_feeds_nic_series(tmp_path: Path) -> None:
    statistics = tmp_path / "class" / "net" / "ens5" / "statistics"
    statistics.mkdir(parents=True)
    for name in ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_dropped",
                 "tx_dropped"):
        (statistics / name).write_text("7\n")
    config = AgentConfig.from_sources(
        listen="127.0.0.1:0", node="n",
        file_values={"agent": {"nic_source": "sysfs", "sysfs_root": str(tmp_path)}})
    agent = AgentService(config, nvml=FakeNvml(gpus=[]))
    try:
        snapshot = agent.poll_once()
    finally:
        agent.shutdown()
    assert snapshot.points[mn.NODE_NET_RX_BYTES] == {("ens5",): 7}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_exposition_passes_promtool_lint(service: AgentService) -> None:
    body = service.render_metrics()
    result = subprocess.run(["promtool", "check", "metrics"], input=body,
                            capture_output=True, timeout=60)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    assert mn.GPU_NVLINK_TX.series.encode() in body


def test_polling_never_spawns_a_process(monkeypatch: pytest.MonkeyPatch,
                                        page_server: PageServer) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"the agent spawned a process: {args!r}")

    page_server.pages["/vllm"] = render_vllm()
    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(os, "system", refuse)
    monkeypatch.setattr(os, "posix_spawn", refuse)
    agent = AgentService(AgentConfig(listen="127.0.0.1:0", node="n",
                                     engine_metrics_urls=(page_server.url("/vllm"),)),
                         nvml=FakeNvml([FakeGpu()]))
    try:
        for _ in range(3):
            snapshot = agent.poll_once()
    finally:
        agent.shutdown()
    assert snapshot.get(mn.GPU_UTILIZATION, ("0",)) == 0.5


def test_settle_heap_freezes_what_start_up_left() -> None:
    AgentService.settle_heap()
    try:
        assert gc.get_freeze_count() > 0
        assert gc.get_count()[0] < 100  # the start-up garbage was collected first
    finally:
        gc.unfreeze()


def test_a_file_without_an_agent_section_is_read_and_checked_like_one() -> None:
    values = {"listen": "127.0.0.1:5555", "interval": 2, "max_devices": 4, "max_models": 3,
              "engine_timeout": 1.5}
    config = AgentConfig.from_sources(file_values=values)
    assert (config.listen, config.interval_seconds, config.max_devices, config.max_models,
            config.engine_timeout_seconds) == ("127.0.0.1:5555", 2.0, 4, 3, 1.5)
    for layout in ({**values, "intreval": "30s"}, {"agent": {**values, "intreval": "30s"}}):
        with pytest.raises(ConfigError) as excinfo:
            AgentConfig.from_sources(file_values=layout)
        assert excinfo.value.key == "intreval"


def test_tls_settings_come_from_flags_environment_or_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from testkit.support.certs import make_certs
    from tokenpath.tls import ENV_TLS_CERT, ENV_TLS_KEY

    certs = make_certs(tmp_path)
    file_values = {"agent": {"tls": {"cert": str(certs.server_cert),
                                     "key": str(certs.server_key)}}}
    config = AgentConfig.from_sources(file_values=file_values)
    assert (config.tls.cert, config.tls.client_ca) == (str(certs.server_cert), None)
    # (the client's pair stands in for another server pair: the pair must match)
    monkeypatch.setenv(ENV_TLS_CERT, str(certs.client_cert))
    monkeypatch.setenv(ENV_TLS_KEY, str(certs.client_key))
    assert AgentConfig.from_sources(file_values=file_values).tls.cert == str(certs.client_cert)
    flagged = AgentConfig.from_sources(file_values=file_values, tls_cert=str(certs.server_cert),
                                       tls_key=str(certs.server_key),
                                       tls_client_ca=str(certs.ca))
    assert (flagged.tls.cert, flagged.tls.client_ca) == (str(certs.server_cert), str(certs.ca))
    monkeypatch.delenv(ENV_TLS_CERT)
    monkeypatch.delenv(ENV_TLS_KEY)
    for bad, key in (({"tls": {"cert": str(certs.server_cert)}}, "tls.key"),
                     ({"tls": {"certificate": "x"}}, "tls.certificate"),
                     ({"tls": {"cert": str(tmp_path / "missing.pem"),
                               "key": str(certs.server_key)}}, "tls.cert")):
        with pytest.raises(ConfigError) as err:
            AgentConfig.from_sources(file_values={"agent": bad})
        assert err.value.key == key


def test_the_agent_serves_metrics_over_tls_when_configured(tmp_path: Path) -> None:
    import ssl

    from testkit.support.certs import make_certs

    certs = make_certs(tmp_path)
    config = AgentConfig(listen="127.0.0.1:0", node="tls-node",
                         tls=TlsConfig(cert=str(certs.server_cert), key=str(certs.server_key)))
    service = AgentService(config, nvml=FakeNvml([FakeGpu()]), net_io_counters=lambda: {})
    service.start()
    try:
        assert service.metrics_url is not None and service.metrics_url.startswith("https://")
        url = service.metrics_url.replace("127.0.0.1", "localhost")
        page = httpx.get(url, verify=ssl.create_default_context(cafile=str(certs.ca))).text
        assert f"{mn.AGENT_NVML_UP.series} 1.0" in page
    finally:
        service.shutdown()
