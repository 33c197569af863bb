"""The agent's OTLP push lands in a real ``tokenpath collector`` (node metrics state)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from testkit.fakes.fake_nvml import FakeGpu, FakeNvml
from testkit.support.certs import make_certs
from tokenpath import metric_names as mn
from tokenpath.agent.config import AgentConfig
from tokenpath.agent.service import AgentService
from tokenpath.collector.config import CollectorConfig
from tokenpath.collector.service import CollectorService
from tokenpath.tls import ClientTlsConfig, TlsConfig

TOKEN = "shared-token"
NODE_NAME = "gpu-node-3"


def test_collector_receives_gpu_busy_time_and_nic_bytes_per_node() -> None:
    collector = CollectorService(CollectorConfig(http_host="127.0.0.1", http_port=0,
                                                 grpc_port=None, auth_token=TOKEN))
    collector.start()
    agent = AgentService(
        AgentConfig(listen="127.0.0.1:0", node=NODE_NAME, interval_seconds=0.1,
                    push_interval_seconds=0.1, collector_url=collector.http_url),
        nvml=FakeNvml([FakeGpu(utilization_percent=100), FakeGpu(utilization_percent=25)]),
        auth_token=TOKEN,
    )
    try:
        agent.start(serve=False)
        state = collector.node_metrics
        deadline = time.monotonic() + 20
        busy: dict[tuple[tuple[str, str], ...], float] = {}
        while time.monotonic() < deadline:
            busy = state.latest(NODE_NAME, mn.GPU_BUSY_SECONDS.name)
            if busy.get((("gpu", "0"),), 0.0) > 0:
                break
            time.sleep(0.05)
    finally:
        agent.shutdown()
        collector.shutdown()
    assert busy[(("gpu", "0"),)] > busy[(("gpu", "1"),)] > 0
    assert state.latest(NODE_NAME, mn.AGENT_NVML_UP.name) == {(): 1.0}
    assert state.latest(NODE_NAME, mn.NODE_NET_RX_BYTES.name)
    assert agent.pusher is not None and agent.pusher.failed == 0


def test_the_push_reaches_a_collector_that_requires_mutual_tls(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    server_tls = TlsConfig(cert=str(certs.server_cert), key=str(certs.server_key),
                           client_ca=str(certs.ca))
    collector = CollectorService(CollectorConfig(http_host="127.0.0.1", http_port=0,
                                                 grpc_port=None, tls=server_tls))
    collector.start()
    url = collector.http_url.replace("127.0.0.1", "localhost")  # the certificate's name
    shown = ClientTlsConfig(ca=str(certs.ca), cert=str(certs.client_cert),
                            key=str(certs.client_key))
    agents = {
        "with a client certificate": AgentService(
            AgentConfig(listen="127.0.0.1:0", node=NODE_NAME, push_interval_seconds=0.1,
                        collector_url=url, collector_tls=shown),
            nvml=FakeNvml([FakeGpu()])),
        "without one": AgentService(
            AgentConfig(listen="127.0.0.1:0", node="other-node", push_interval_seconds=0.1,
                        collector_url=url,
                        collector_tls=ClientTlsConfig(ca=str(certs.ca))),
            nvml=FakeNvml([FakeGpu()])),
    }
    try:
        for agent in agents.values():
            agent.start(serve=False)
        deadline = time.monotonic() + 20
        while (time.monotonic() < deadline
               and not collector.node_metrics.latest(NODE_NAME, mn.AGENT_NVML_UP.name)):
            time.sleep(0.05)
    finally:
        for agent in agents.values():
            agent.shutdown()
        collector.shutdown()
    assert collector.node_metrics.latest(NODE_NAME, mn.AGENT_NVML_UP.name) == {(): 1.0}
    assert not collector.node_metrics.latest("other-node", mn.AGENT_NVML_UP.name)
    refused = agents["without one"].pusher
    assert refused is not None and refused.sent == 0 and refused.failed > 0


def test_push_tls_files_are_checked_naming_their_key(tmp_path: Path) -> None:
    from tokenpath.config import ConfigError

    certs = make_certs(tmp_path)
    for settings, key in (({"collector_tls": {"cert": str(certs.client_cert)}},
                           "collector_tls.key"),
                          ({"collector_tls": {"ca": str(tmp_path / "none.pem")}},
                           "collector_tls.ca"),
                          ({"collector_tls": {"authority": "x"}}, "collector_tls.authority")):
        with pytest.raises(ConfigError) as err:
            AgentConfig.from_sources(file_values={"agent": settings})
        assert err.value.key == key
    flagged = AgentConfig.from_sources(collector_ca=str(certs.ca))
    assert flagged.collector_tls.ca == str(certs.ca)
