"""KV-event endpoints in the agent's config, service and command line."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import httpx
import pytest

from testkit.fakes.fake_nvml import FakeNvml
from testkit.fakes.kv_events import KvPublisher, block_hash, vllm_batch, vllm_stored
from testkit.support.processes import free_port
from tokenpath import metric_names as mn
from tokenpath.agent.config import ENV_KV_EVENTS, AgentConfig
from tokenpath.agent.kv_receiver import KvEndpoint
from tokenpath.agent.service import AgentService
from tokenpath.config import ConfigError

WAIT_SECONDS = 10.0


def test_endpoints_resolve_argument_over_env_over_file(monkeypatch: pytest.MonkeyPatch) -> None:
    file_values = {"agent": {"kv_events": ["tcp://127.0.0.1:5000"],
                             "kv_event_models": {"vllm-0": "llama"},
                             "kv_events_replay": {"vllm-0": "tcp://127.0.0.1:5600"},
                             "kv_max_blocks": 5000}}
    config = AgentConfig.from_sources(file_values=file_values)
    assert config.kv_endpoints == (KvEndpoint("tcp://127.0.0.1:5000"),)
    assert config.kv_event_models == {"vllm-0": "llama"}
    assert config.kv_events_replay == {"vllm-0": "tcp://127.0.0.1:5600"}
    assert config.kv_max_blocks == 5000
    monkeypatch.setenv(ENV_KV_EVENTS, "a=tcp://127.0.0.1:5001,b=tcp://127.0.0.1:5002")
    assert AgentConfig.from_sources(file_values=file_values).kv_endpoints == (
        KvEndpoint("tcp://127.0.0.1:5001", "a"), KvEndpoint("tcp://127.0.0.1:5002", "b"))
    config = AgentConfig.from_sources(kv_events=["tcp://127.0.0.1:5003"])
    assert config.kv_events == ("tcp://127.0.0.1:5003",)


@pytest.mark.parametrize(("kwargs", "file_values", "key"), [
    ({"kv_events": ["localhost:5557"]}, None, "kv_events"),
    ({"kv_events": ["tcp://127.0.0.1:1", "x=tcp://127.0.0.1:1"]}, None, "kv_events"),
    ({}, {"agent": {"kv_events_replay": {"a": "http://x:1"}}}, "kv_events_replay"),
    ({}, {"agent": {"kv_events_replay": ["tcp://x:1"]}}, "kv_events_replay"),
    ({}, {"agent": {"kv_event_models": {"a": 3}}}, "kv_event_models"),
    ({}, {"agent": {"kv_max_blocks": 0}}, "kv_max_blocks"),
])
def test_bad_kv_settings_name_the_key(kwargs: dict[str, object],
                                      file_values: dict[str, object] | None, key: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        AgentConfig.from_sources(file_values=file_values, **kwargs)  # type: ignore[arg-type]
    assert excinfo.value.key == key


def test_metrics_keep_answering_while_the_receiver_is_flooded() -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    config = AgentConfig(listen="127.0.0.1:0", node="node-a", interval_seconds=0.05,
                         kv_events=(endpoint,), kv_event_models={"engine-a": "m"})
    agent = AgentService(config, nvml=FakeNvml([]))
    agent.start()
    publisher = KvPublisher(endpoint, "engine-a")
    stop = threading.Event()

    def flood() -> None:
        junk = b"\x93" + b"\xc1" * 4096
        good = vllm_batch(1.0, [vllm_stored([block_hash(n) for n in range(64)])])
        while not stop.is_set():
            publisher.publish(junk)
            publisher.publish(good)

    flooder = threading.Thread(target=flood)
    flooder.start()
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        answered = 0
        dropped = 0.0
        while answered < 20 or not dropped:
            assert time.monotonic() < deadline, (answered, dropped)
            reply = httpx.get(f"{agent.metrics_url}", timeout=5)
            assert reply.status_code == 200
            answered += 1
            snapshot = agent.latest
            assert snapshot is not None
            dropped = snapshot.get(mn.KV_EVENTS_DROPPED, ("engine-a", "undecodable")) or 0.0
    finally:
        stop.set()
        flooder.join()
        publisher.close()
        agent.shutdown()


def test_an_endpoint_the_agent_cannot_bind_or_reach_stops_it_naming_the_key() -> None:
    config = AgentConfig(listen="127.0.0.1:0", node="node-a",
                         kv_events=("tcp://no-such-host.invalid:5557",))
    agent = AgentService(config, nvml=FakeNvml([]))
    try:
        with pytest.raises(ConfigError) as excinfo:
            agent.start(serve=False)
        assert excinfo.value.key == "kv_events"
    finally:
        agent.shutdown()


@pytest.mark.integration
def test_the_command_refuses_a_bad_endpoint_with_the_key() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tokenpath.cli.main", "agent", "--once",
         "--kv-events", "127.0.0.1:5557"], capture_output=True, text=True, timeout=60,
        check=False)
    assert done.returncode == 2
    assert "kv_events" in done.stdout + done.stderr
