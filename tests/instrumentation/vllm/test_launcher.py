from __future__ import annotations

from pathlib import Path

import pytest

from tokenpath.config import ConfigError
from tokenpath.instrumentation.vllm.launcher import LocalVllmConfig, vllm_command


def test_command_enables_prefix_caching_and_tracing_when_endpoint_given() -> None:
    config = LocalVllmConfig(otlp_endpoint="127.0.0.1:4317", model_dir=Path("/m"),
                             extra_args=("--max-model-len", "512"))
    command = vllm_command(Path("/venv/bin/python"), config, 8123)
    assert command[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    joined = " ".join(command)
    assert "--model /m" in joined
    assert "--port 8123" in joined
    assert "--enable-prefix-caching" in command
    assert "--enforce-eager" in command
    assert "--otlp-traces-endpoint 127.0.0.1:4317 --collect-detailed-traces all" in joined
    assert command[-2:] == ["--max-model-len", "512"]


def test_command_without_endpoint_has_no_tracing_flags() -> None:
    command = vllm_command(Path("python"), LocalVllmConfig(), 1)
    assert "--otlp-traces-endpoint" not in command


@pytest.mark.parametrize(("field", "value"), [("otlp_endpoint", "nohost"), ("port", 70000),
                                               ("kv_cache_space_gib", 0)])
def test_validate_names_the_bad_field(field: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        LocalVllmConfig(**{field: value}).validate()  # type: ignore[arg-type]
    assert info.value.key == field
