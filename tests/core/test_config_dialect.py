"""One config dialect: the agent and the collector read file values by the same rule
(tokenpath.config.typed_value) and both name the offending key."""

from __future__ import annotations

import pytest

from tokenpath.agent.config import AgentConfig
from tokenpath.collector.config import CollectorConfig
from tokenpath.config import ConfigError


@pytest.mark.parametrize(("agent_file", "collector_file", "value"), [
    ({"max_devices": "5"}, {"assembler": {"max_spans_per_trace": "5"}}, "'5'"),
    ({"max_devices": 5.0}, {"assembler": {"max_spans_per_trace": 5.0}}, "5.0"),
    ({"max_devices": True}, {"assembler": {"max_spans_per_trace": True}}, "True"),
])
def test_an_integer_setting_refuses_the_same_values_in_both(
        agent_file: dict[str, object], collector_file: dict[str, object], value: str) -> None:
    with pytest.raises(ConfigError) as agent_error:
        AgentConfig.from_sources(file_values={"agent": agent_file})
    with pytest.raises(ConfigError) as collector_error:
        CollectorConfig.from_sources(file=collector_file)
    assert agent_error.value.key == "max_devices"
    assert collector_error.value.key == "assembler.max_spans_per_trace"
    assert agent_error.value.message == collector_error.value.message == (
        f"must be an integer, not {value}")


def test_durations_take_seconds_or_a_unit_and_end_in_seconds_in_both() -> None:
    agent = AgentConfig.from_sources(file_values={"agent": {"push_interval_seconds": "2m",
                                                            "engine_timeout": 3}})
    collector = CollectorConfig.from_sources(file={"cost": {"max_delay_seconds": "2m"}})
    assert agent.push_interval_seconds == collector.cost.max_delay_seconds == 120.0
    assert agent.engine_timeout_seconds == 3.0  # the older short key still works
    with pytest.raises(ConfigError) as excinfo:
        AgentConfig.from_sources(file_values={"agent": {"push_interval_seconds": True}})
    assert excinfo.value.key == "push_interval_seconds"


def test_environment_values_are_text_parsed_by_the_same_rule(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenpath.agent.config import ENV_INTERVAL

    monkeypatch.setenv(ENV_INTERVAL, "500ms")
    assert AgentConfig.from_sources().interval_seconds == 0.5
    monkeypatch.setenv(ENV_INTERVAL, "soon")
    with pytest.raises(ConfigError) as excinfo:
        AgentConfig.from_sources()
    assert excinfo.value.key == ENV_INTERVAL
