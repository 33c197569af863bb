"""The collector's config file: every wrong key or value is an error that names it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tokenpath.collector.config import CollectorConfig
from tokenpath.config import ConfigError, parse_duration


def _load(tmp_path: Path, file: dict[str, Any]) -> CollectorConfig:
    return CollectorConfig.from_sources(store=str(tmp_path / "s.db"), file=file)


@pytest.mark.parametrize(("file", "key"), [
    ({"htpp": "127.0.0.1:4318"}, "htpp"),  # a misspelled top-level key
    ({"assembler": {"max_traces": "1000"}}, "assembler.max_traces"),
    ({"assembler": {"max_traces": 1000.5}}, "assembler.max_traces"),
    ({"assembler": {"max_traces": True}}, "assembler.max_traces"),
    ({"assembler": {"root_grace_seconds": "soon"}}, "assembler.root_grace_seconds"),
    ({"assembler": {"idle_timeout_seconds": float("nan")}}, "assembler.idle_timeout_seconds"),
    ({"cost": {"tick_seconds": float("inf")}}, "cost.tick_seconds"),
    ({"cost": {"lag_window": "2k"}}, "cost.lag_window"),
    ({"limits": {"keep_content_attributes": "yes"}}, "limits.keep_content_attributes"),
    ({"retention": "nan"}, "retention"),
    ({"retention": True}, "retention"),
    ({"max_buffered_spans": True}, "max_buffered_spans"),
    ({"gc_young_threshold": -1}, "gc_young_threshold"),
    ({"store_queue_size": 0}, "store_queue_size"),
    ({"store_queue_size": "64"}, "store_queue_size"),
    ({"store_batch_size": 0}, "store_batch_size"),
    ({"gc_young_threshold": "lots"}, "gc_young_threshold"),
])
def test_a_wrong_key_or_value_names_the_key(tmp_path: Path, file: dict[str, Any],
                                           key: str) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, file)
    assert err.value.key == key


def test_seconds_take_durations_and_numbers(tmp_path: Path) -> None:
    config = _load(tmp_path, {"assembler": {"root_grace_seconds": "6s",
                                            "idle_timeout_seconds": 30},
                              "cost": {"max_delay_seconds": "5m"}, "retention": "2d"})
    assert config.assembler.root_grace_seconds == 6.0
    assert config.assembler.idle_timeout_seconds == 30.0
    assert config.cost.max_delay_seconds == 300.0
    assert config.retention_seconds == 2 * 86400.0


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", float("nan"), True])
def test_a_duration_is_finite_and_not_a_boolean(value: Any) -> None:
    with pytest.raises(ConfigError) as err:
        parse_duration(value, "since")
    assert err.value.key == "since"


def test_a_file_shared_with_the_agent_is_read_and_its_agent_section_left_alone(
        tmp_path: Path) -> None:
    config = _load(tmp_path, {"http": "127.0.0.1:4318", "agent": {"interval": "2s"}})
    assert config.http_port == 4318


def test_the_old_pipeline_queue_size_is_read_as_twice_the_shedding_depth(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert _load(tmp_path, {}).pipeline_shed_at == 10_000
    assert _load(tmp_path, {"pipeline_shed_at": 300}).pipeline_shed_at == 300
    with caplog.at_level("WARNING"):
        assert _load(tmp_path, {"pipeline_queue_size": 600}).pipeline_shed_at == 300
    assert "rename the key" in caplog.text
    with pytest.raises(ConfigError, match="pipeline_queue_size"):
        _load(tmp_path, {"pipeline_queue_size": 600, "pipeline_shed_at": 300})
    with pytest.raises(ConfigError, match="pipeline_shed_at"):
        _load(tmp_path, {"pipeline_shed_at": 0})
