"""The docker-compose stack and its configs, checked against documented keys (docker does
not run here) and with the real promtool/amtool where they are installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.documented_keys import compose_errors, otel_config_errors

REPO = Path(__file__).resolve().parents[2]
COMPOSE_DIR = REPO / "deploy" / "compose"


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def test_compose_uses_only_documented_keys() -> None:
    assert compose_errors(_load(COMPOSE_DIR / "docker-compose.yml")) == []


def test_allow_list_catches_a_misspelled_key() -> None:
    compose = _load(COMPOSE_DIR / "docker-compose.yml")
    compose["services"]["prometheus"]["volume"] = []
    assert compose_errors(compose) == ["services.prometheus.volume: not a documented "
                                       "service key"]


def test_compose_has_the_whole_stack() -> None:
    services = _load(COMPOSE_DIR / "docker-compose.yml")["services"]
    images = {name: str(s.get("image", "")) for name, s in services.items()}
    assert any(i.startswith("prom/prometheus") for i in images.values())
    assert any(i.startswith("prom/alertmanager") for i in images.values())
    assert any(i.startswith("grafana/grafana") for i in images.values())
    assert any("opentelemetry-collector-contrib" in i for i in images.values())
    commands = [" ".join(s.get("command", [])) for s in services.values()]
    assert sum(c.startswith("collector ") for c in commands) == 2
    assert any(i.startswith("clickhouse/clickhouse-server") for i in images.values())
    stores = [c.split("--store ", 1)[1].split()[0] for c in commands
              if c.startswith("collector ")]
    assert stores == ["clickhouse://tokenpath@clickhouse:8123/tokenpath"] * 2
    assert any(c.startswith("agent ") for c in commands)
    assert any(c.startswith("demo ") for c in commands)


def test_compose_bind_mounts_exist_and_ports_bind_loopback() -> None:
    compose = _load(COMPOSE_DIR / "docker-compose.yml")
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (COMPOSE_DIR / source).exists(), (name, source)
            else:
                assert source in compose["volumes"], (name, source)
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)
    for secret in compose["secrets"].values():
        assert (COMPOSE_DIR / secret["file"]).is_file()


def test_grafana_mounts_the_generated_dashboards_and_provisioning() -> None:
    grafana = _load(COMPOSE_DIR / "docker-compose.yml")["services"]["grafana"]
    sources = {v.split(":")[0]: v.split(":")[1] for v in grafana["volumes"]}
    provider = _load(REPO / "dashboards" / "provisioning" / "tokenpath-dashboards.yaml")
    dashboards_path = provider["providers"][0]["options"]["path"]
    assert sources["../../dashboards/grafana"] == dashboards_path
    assert sources["../../dashboards/provisioning"] == "/etc/grafana/provisioning/dashboards"


def test_otel_gateway_routes_traces_by_trace_id_to_both_collectors() -> None:
    config = _load(COMPOSE_DIR / "otel-gateway.yaml")
    assert otel_config_errors(config) == []
    exporter = config["exporters"]["loadbalancing"]
    assert exporter["routing_key"] == "traceID"
    assert exporter["resolver"]["static"]["hostnames"] == ["collector-1:4317",
                                                           "collector-2:4317"]
    assert config["service"]["pipelines"]["traces"]["exporters"] == ["loadbalancing"]


def test_otel_checker_catches_a_dangling_pipeline_reference() -> None:
    config = _load(COMPOSE_DIR / "otel-gateway.yaml")
    config["service"]["pipelines"]["traces"]["exporters"] = ["loadbalancer"]
    assert otel_config_errors(config) == [
        "pipelines.traces.exporters: loadbalancer undefined"]


def test_prometheus_and_alertmanager_configs_pass_their_own_checkers() -> None:
    promtool, amtool = shutil.which("promtool"), shutil.which("amtool")
    if promtool is None or amtool is None:
        pytest.skip("promtool/amtool not installed (scripts/install-system-deps.sh)")
    for argv in ([promtool, "check", "config", "prometheus.yml"],
                 [amtool, "check-config", "alertmanager.yml"]):
        result = subprocess.run(argv, cwd=COMPOSE_DIR, capture_output=True, text=True,
                                timeout=60, check=False)
        assert result.returncode == 0, result.stdout + result.stderr
