"""``tokenpath agent`` as a subprocess on this GPU-less machine, scraped over loopback."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from testkit.fakes.engine_pages import render_vllm
from testkit.support.certs import make_certs
from testkit.support.processes import free_port, stop_process
from tests.agent.conftest import PageServer
from tokenpath import metric_names as mn
from tokenpath.cli.common import AUTH_TOKEN_ENV

pytestmark = pytest.mark.integration
TOKEN = "cli-token"
STARTUP_SECONDS = 60.0


def machine_has_nvml() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return False
    pynvml.nvmlShutdown()
    return True


EXPECTED_NVML_UP = 1.0 if machine_has_nvml() else 0.0


def agent_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENPATH_")}
    env.update(extra)
    return env


def wait_healthy(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            _out, err = process.communicate()
            raise AssertionError(f"agent exited {process.returncode}: {err.decode()}")
        try:
            if httpx.get(url + "/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError("agent did not become healthy")


def test_agent_subprocess_serves_metrics_without_a_gpu(page_server: PageServer,
                                                       dead_url: str) -> None:
    page_server.pages["/metrics"] = render_vllm()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-m", "tokenpath.cli.main", "agent", "--listen", f"127.0.0.1:{port}",
         "--interval", "0.2", "--node", "cli-node",
         "--engine-metrics", page_server.url("/metrics"), "--engine-metrics", dead_url],
        env=agent_env(**{AUTH_TOKEN_ENV: TOKEN}),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        wait_healthy(base, process)
        assert httpx.get(base + "/metrics").status_code == 401
        time.sleep(0.5)  # a few polls
        response = httpx.get(base + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert response.status_code == 200
        values = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.text)
            for s in family.samples
        }
        assert values[(mn.AGENT_NVML_UP.series, ())] == EXPECTED_NVML_UP
        devices = {dict(labels).get("device") for name, labels in values
                   if name == mn.NODE_NET_RX_BYTES.series}
        assert "lo" in devices
        assert values[(mn.ENGINE_PREFIX_HIT_TOKENS.series,
                       (("engine", "vllm"), ("model", "tiny-llama")))] == 2048
        dead_errors = [v for (name, labels), v in values.items()
                       if name == mn.AGENT_SCRAPE_ERRORS.series
                       and dict(labels)["source"].startswith("engine:")]
        assert dead_errors and dead_errors[0] >= 1
    finally:
        stop_process(process)
    assert process.returncode == 0, process.stderr.read().decode() if process.stderr else ""


def test_once_json_prints_one_poll() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tokenpath.cli.main", "agent", "--once", "--format", "json",
         "--node", "probe-node"],
        env=agent_env(), capture_output=True, timeout=60, check=True,
    )
    payload = json.loads(result.stdout)
    assert payload["node"] == "probe-node"
    assert payload["nvml_up"] is bool(EXPECTED_NVML_UP)
    assert payload["metrics"][mn.AGENT_NVML_UP.series] == [
        {"labels": {}, "value": EXPECTED_NVML_UP}]
    assert mn.NODE_NET_RX_BYTES.series in payload["metrics"]


def test_bad_flag_value_exits_non_zero_with_the_key() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tokenpath.cli.main", "agent", "--listen", "nowhere"],
        env=agent_env(), capture_output=True, timeout=60,
    )
    assert result.returncode == 2
    assert b"listen" in result.stderr


def test_agent_subprocess_serves_metrics_over_mutual_tls(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tokenpath.cli.main", "agent", "--listen", f"127.0.0.1:{port}",
         "--node", "tls-node", "--tls-cert", str(certs.server_cert), "--tls-key",
         str(certs.server_key), "--tls-client-ca", str(certs.ca)],
        env=agent_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    client = ssl.create_default_context(cafile=str(certs.ca))
    client.load_cert_chain(str(certs.client_cert), str(certs.client_key))
    base = f"https://localhost:{port}"
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            if process.poll() is not None:
                raise AssertionError(process.communicate()[1].decode())
            try:
                page = httpx.get(base + "/metrics", verify=client, timeout=1.0)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert page.status_code == 200 and mn.AGENT_NVML_UP.series in page.text
        anonymous = ssl.create_default_context(cafile=str(certs.ca))
        with pytest.raises(httpx.HTTPError):  # no client certificate: refused
            httpx.get(base + "/metrics", verify=anonymous, timeout=3.0)
    finally:
        stop_process(process)
    stdout = process.stdout.read().decode() if process.stdout is not None else ""
    assert f"https://127.0.0.1:{port}/metrics" in stdout  # the startup line names https
