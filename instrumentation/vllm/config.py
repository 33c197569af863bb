"""Configuration of tokenpath's vLLM stat-logger plugin, read from the environment.

vLLM builds stat loggers itself (``cls(vllm_config, engine_index)``), so the plugin cannot
take arguments: every setting comes from an environment variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from tokenpath.config import ConfigError, check, parse_host_port, validate_fields
from tokenpath.endpoints import COLLECTOR_GRPC

ENV_ENDPOINT = "TOKENPATH_OTLP_ENDPOINT"
ENV_QUEUE_SIZE = "TOKENPATH_VLLM_QUEUE_SIZE"
ENV_FLUSH_INTERVAL = "TOKENPATH_VLLM_FLUSH_INTERVAL"
ENV_STEP_WINDOW = "TOKENPATH_VLLM_STEP_WINDOW"
ENV_NODE = "TOKENPATH_NODE"
ENV_POOL = "TOKENPATH_POOL"
ENV_AUTH_TOKEN = "TOKENPATH_AUTH_TOKEN"
ENV_DISABLED = "TOKENPATH_VLLM_PLUGIN_DISABLED"

DEFAULT_ENDPOINT = COLLECTOR_GRPC
DEFAULT_QUEUE_SIZE = 8192
DEFAULT_FLUSH_INTERVAL_SECONDS = 1.0
DEFAULT_STEP_WINDOW = 4096
DEFAULT_MAX_BATCH_SPANS = 512
SERVICE_NAME = "vllm"


@dataclass(frozen=True, slots=True)
class PluginConfig:
    """Where and how the plugin exports.

    ``endpoint``: ``HOST:PORT`` for OTLP/gRPC (the collector's ``--grpc``), or an
    ``http(s)://HOST:PORT`` URL for OTLP/HTTP (``/v1/traces`` is appended).
    ``queue_size``: items the engine loop may hand over before new ones are dropped.
    ``flush_interval_seconds``: how often the export thread sends a batch and a step summary.
    ``step_window``: engine steps remembered for per-request step summaries.
    """

    endpoint: str = DEFAULT_ENDPOINT
    queue_size: int = field(default=DEFAULT_QUEUE_SIZE, metadata=check(
        ge=1, key=ENV_QUEUE_SIZE, message="must be at least 1, got {value}"))
    flush_interval_seconds: float = field(default=DEFAULT_FLUSH_INTERVAL_SECONDS, metadata=check(
        gt=0, key=ENV_FLUSH_INTERVAL, message="must be positive, got {value}"))
    step_window: int = field(default=DEFAULT_STEP_WINDOW, metadata=check(
        ge=1, key=ENV_STEP_WINDOW, message="must be at least 1, got {value}"))
    max_batch_spans: int = DEFAULT_MAX_BATCH_SPANS
    node: str | None = None
    pool: str | None = None
    auth_token: str | None = None
    enabled: bool = True

    @property
    def uses_http(self) -> bool:
        return self.endpoint.startswith(("http://", "https://"))

    def validate(self) -> PluginConfig:
        if not self.uses_http:
            parse_host_port(self.endpoint, ENV_ENDPOINT)
        validate_fields(self)  # errors name the environment variables
        return self

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PluginConfig:
        env = os.environ if environ is None else environ

        def number(key: str, default: float, convert: type[int] | type[float]) -> float:
            raw = env.get(key, "")
            if raw == "":
                return default
            try:
                return convert(raw)
            except ValueError as exc:
                raise ConfigError(key, f"not a number: {raw!r}") from exc

        return cls(
            endpoint=env.get(ENV_ENDPOINT) or DEFAULT_ENDPOINT,
            queue_size=int(number(ENV_QUEUE_SIZE, DEFAULT_QUEUE_SIZE, int)),
            flush_interval_seconds=float(
                number(ENV_FLUSH_INTERVAL, DEFAULT_FLUSH_INTERVAL_SECONDS, float)
            ),
            step_window=int(number(ENV_STEP_WINDOW, DEFAULT_STEP_WINDOW, int)),
            node=env.get(ENV_NODE) or None,
            pool=env.get(ENV_POOL) or None,
            auth_token=env.get(ENV_AUTH_TOKEN) or None,
            enabled=env.get(ENV_DISABLED, "").lower() not in ("1", "true", "yes"),
        ).validate()
