from __future__ import annotations

import pytest

from tokenpath.config import ConfigError
from tokenpath.instrumentation.vllm.config import (
    DEFAULT_ENDPOINT,
    ENV_ENDPOINT,
    ENV_QUEUE_SIZE,
    PluginConfig,
)


def test_defaults_point_at_local_collector_grpc() -> None:
    config = PluginConfig.from_env({})
    assert config.endpoint == DEFAULT_ENDPOINT
    assert not config.uses_http
    assert config.enabled


def test_http_url_selects_otlp_http() -> None:
    config = PluginConfig.from_env({ENV_ENDPOINT: "http://127.0.0.1:4318"})
    assert config.uses_http


@pytest.mark.parametrize(
    ("env", "key"),
    [({ENV_ENDPOINT: "no-port"}, ENV_ENDPOINT), ({ENV_QUEUE_SIZE: "0"}, ENV_QUEUE_SIZE),
     ({ENV_QUEUE_SIZE: "many"}, ENV_QUEUE_SIZE)],
)
def test_bad_values_name_their_variable(env: dict[str, str], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        PluginConfig.from_env(env)
    assert info.value.key == key
