"""The agent's OTLP push lands in a real ``tokenpath collector`` (node metrics state)."""

from __future__ import annotations

import time

from tests.fakes.fake_nvml import FakeGpu, FakeNvml
from tokenpath import metric_names as mn
from tokenpath.agent.config import AgentConfig
from tokenpath.agent.service import AgentService
from tokenpath.collector.config import CollectorConfig
from tokenpath.collector.service import CollectorService

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
