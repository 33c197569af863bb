"""The agent's configuration: one dataclass, named defaults, ``validate()`` naming the key.

Values resolve argument > environment > config file (``agent:`` section, or the agent's
keys at the top level of a file without one) > default, by the one value rule of
:mod:`tokenpath.config` that the collector follows too: a file value has its setting's
type (``max_devices: 5``, not ``"5"``), a duration is a number of seconds or ``30s``, and
environment values are text parsed by the same rule. Duration keys end in ``_seconds``
(``push_interval_seconds``); the older short keys (``push_interval``) still work. Unknown
file keys are errors in both layouts.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, cast
from urllib.parse import urlsplit

from tokenpath.agent.kv_index import DEFAULT_MAX_BLOCKS
from tokenpath.agent.kv_receiver import KvEndpoint, check_engine_id, parse_kv_endpoint
from tokenpath.agent.nic_sampler import (
    DEFAULT_NIC_EXCLUDE,
    DEFAULT_SYSFS_ROOT,
    NIC_SOURCES,
    NicSource,
)
from tokenpath.config import (
    ConfigError,
    check,
    parse_host_port,
    resolve,
    resolve_typed,
    validate_fields,
)
from tokenpath.endpoints import AGENT_LISTEN
from tokenpath.tls import ClientTlsConfig, TlsConfig

DEFAULT_LISTEN: Final = AGENT_LISTEN
DEFAULT_INTERVAL_SECONDS: Final = 1.0
MIN_INTERVAL_SECONDS: Final = 0.05
# Upper bound for every duration setting (an "inf" would silently mean "never").
MAX_DURATION_SECONDS: Final = 86_400.0
DEFAULT_ENGINE_TIMEOUT_SECONDS: Final = 2.0
# Engine pages are cumulative counters plus a few gauges; every 5 s keeps them as fresh as
# the push while fetching (and making the engine render) its /metrics page 5x less often.
DEFAULT_ENGINE_INTERVAL_SECONDS: Final = 5.0
DEFAULT_PUSH_TIMEOUT_SECONDS: Final = 5.0
# Counters pushed are cumulative, so a push every few polls loses no counts, only latency.
DEFAULT_PUSH_INTERVAL_SECONDS: Final = 5.0
DEFAULT_MAX_DEVICES: Final = 32
DEFAULT_MAX_MODELS: Final = 16
DEFAULT_MAX_SOURCES: Final = 64
DEFAULT_NVML_RETRY_SECONDS: Final = 60.0

ENV_LISTEN: Final = "TOKENPATH_AGENT_LISTEN"
ENV_COLLECTOR: Final = "TOKENPATH_AGENT_COLLECTOR"
ENV_INTERVAL: Final = "TOKENPATH_AGENT_INTERVAL"
ENV_ENGINE_METRICS: Final = "TOKENPATH_AGENT_ENGINE_METRICS"
ENV_NODE: Final = "TOKENPATH_AGENT_NODE"
ENV_KV_EVENTS: Final = "TOKENPATH_AGENT_KV_EVENTS"
# An engine's KV-block index is bounded; the largest GPU KV caches hold a few hundred
# thousand blocks.
MAX_KV_BLOCKS: Final = 100_000_000
ENV_COLLECTOR_CA: Final = "TOKENPATH_AGENT_COLLECTOR_CA"
ENV_COLLECTOR_CERT: Final = "TOKENPATH_AGENT_COLLECTOR_CERT"
ENV_COLLECTOR_KEY: Final = "TOKENPATH_AGENT_COLLECTOR_KEY"
# The Kubernetes downward-API convention (spec.nodeName); the default when set.
ENV_KUBERNETES_NODE_NAME: Final = "NODE_NAME"
FILE_SECTION: Final = "agent"


def default_node_name() -> str:
    """``NODE_NAME`` (downward API) when set, else the hostname."""
    return os.environ.get(ENV_KUBERNETES_NODE_NAME, "").strip() or socket.gethostname()


def _engine_map(key: str, value: Any) -> dict[str, str]:
    """A file mapping of engine id -> text (a model name, a replay address)."""
    if not isinstance(value, Mapping):
        raise ConfigError(key, "must be a mapping of engine id to a value")
    result: dict[str, str] = {}
    for engine, text in value.items():
        if not isinstance(engine, str) or not isinstance(text, str) or not text:
            raise ConfigError(key, f"expected text keys and values, got {engine!r}: {text!r}")
        check_engine_id(engine, key)
        result[engine] = text
    return result


def _url_list(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(value, list | tuple):
        return tuple(str(part).strip() for part in value if str(part).strip())
    raise ValueError("expected a list of URLs or a comma-separated string")


def _duration(key: str) -> Mapping[str, Any]:
    """A positive duration of at most a day, named ``key`` in errors."""
    return check(gt=0, le=MAX_DURATION_SECONDS, key=key, message=(
        f"must be positive and at most {MAX_DURATION_SECONDS:g} s, got {{value!r}}"))


_CAP = check(ge=1, le=10_000, message="must be between 1 and 10000, got {value!r}")


@dataclass(frozen=True, slots=True)
class AgentConfig:
    listen: str = DEFAULT_LISTEN
    collector_url: str | None = None
    interval_seconds: float = field(default=DEFAULT_INTERVAL_SECONDS, metadata=check(
        ge=MIN_INTERVAL_SECONDS, le=MAX_DURATION_SECONDS, key="interval",
        message=f"must be between {MIN_INTERVAL_SECONDS} s and {MAX_DURATION_SECONDS:g} s"))
    engine_metrics_urls: tuple[str, ...] = ()
    node: str = field(default_factory=lambda: default_node_name(), metadata=check(
        non_empty=True, max_length=253,
        message="must be a non-empty name of at most 253 characters"))
    engine_timeout_seconds: float = field(default=DEFAULT_ENGINE_TIMEOUT_SECONDS,
                                          metadata=_duration("engine_timeout"))
    engine_interval_seconds: float = field(default=DEFAULT_ENGINE_INTERVAL_SECONDS,
                                           metadata=_duration("engine_interval"))
    push_timeout_seconds: float = field(default=DEFAULT_PUSH_TIMEOUT_SECONDS,
                                        metadata=_duration("push_timeout"))
    push_interval_seconds: float = field(default=DEFAULT_PUSH_INTERVAL_SECONDS,
                                         metadata=_duration("push_interval"))
    nic_source: NicSource = field(default="auto", metadata=check(one_of=NIC_SOURCES))
    nic_exclude: str = DEFAULT_NIC_EXCLUDE
    sysfs_root: str = field(default=str(DEFAULT_SYSFS_ROOT), metadata=check(
        non_empty=True, message="must be a directory path"))
    pcie_throughput: bool = True
    nvml_retry_seconds: float = field(default=DEFAULT_NVML_RETRY_SECONDS,
                                      metadata=_duration("nvml_retry"))
    max_devices: int = field(default=DEFAULT_MAX_DEVICES, metadata=_CAP)
    max_models: int = field(default=DEFAULT_MAX_MODELS, metadata=_CAP)
    max_sources: int = field(default=DEFAULT_MAX_SOURCES, metadata=_CAP)
    # KV-cache event endpoints, ``[ENGINE_ID=]tcp://HOST:PORT`` (agent/kv_receiver.py).
    kv_events: tuple[str, ...] = ()
    # engine id -> model name, for the ``model`` label (engines of one model on a node
    # are compared for the ``routed`` cause); unnamed engines share the model "unknown".
    kv_event_models: dict[str, str] = field(default_factory=dict)
    # engine id -> the engine's replay endpoint (vLLM's ``replay_endpoint``).
    kv_events_replay: dict[str, str] = field(default_factory=dict)
    kv_max_blocks: int = field(default=DEFAULT_MAX_BLOCKS, metadata=check(
        ge=1, le=MAX_KV_BLOCKS, message=f"must be between 1 and {MAX_KV_BLOCKS}, got {{value!r}}"))
    # TLS (and mTLS with a client CA) on the /metrics listener: the collector's settings.
    tls: TlsConfig = field(default_factory=TlsConfig)
    # How the OTLP push meets an https:// collector: its CA, and a client certificate
    # when the collector requires one (mTLS). Unset: the system's CA store.
    collector_tls: ClientTlsConfig = field(default_factory=ClientTlsConfig)

    @property
    def listen_address(self) -> tuple[str, int]:
        return parse_host_port(self.listen, "listen")

    @property
    def kv_endpoints(self) -> tuple[KvEndpoint, ...]:
        return tuple(parse_kv_endpoint(value) for value in self.kv_events)

    def validate(self) -> AgentConfig:
        self.listen_address  # noqa: B018 - raises ConfigError naming "listen"
        if self.collector_url is not None:
            _check_url(self.collector_url, "collector")
        for url in self.engine_metrics_urls:
            _check_url(url, "engine_metrics")
        validate_fields(self)  # top-level keys: no section
        try:
            re.compile(self.nic_exclude)
        except re.error as exc:
            raise ConfigError("nic_exclude", f"not a regular expression: {exc}") from exc
        addresses = [endpoint.address for endpoint in self.kv_endpoints]
        if len(set(addresses)) != len(addresses):
            raise ConfigError("kv_events", "an endpoint is named twice")
        for engine, address in self.kv_events_replay.items():
            check_engine_id(engine, "kv_events_replay")
            parse_kv_endpoint(address, "kv_events_replay")
        for engine in self.kv_event_models:
            check_engine_id(engine, "kv_event_models")
        self.tls.validate()
        self.collector_tls.validate()
        return self

    @classmethod
    def from_sources(
        cls,
        *,
        listen: str | None = None,
        collector_url: str | None = None,
        interval: str | float | None = None,
        engine_metrics_urls: list[str] | None = None,
        node: str | None = None,
        kv_events: list[str] | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        tls_client_ca: str | None = None,
        collector_ca: str | None = None,
        collector_cert: str | None = None,
        collector_key: str | None = None,
        file_values: Mapping[str, Any] | None = None,
    ) -> AgentConfig:
        """Resolve every field argument > environment > file > default, then validate."""
        raw = dict(file_values or {})
        explicit_section = FILE_SECTION in raw
        section_value = raw[FILE_SECTION] if explicit_section else raw
        if not isinstance(section_value, Mapping):
            raise ConfigError(FILE_SECTION, "must be a mapping")
        section: Mapping[str, Any] = section_value
        # Checked in both layouts: at the top level, a typo is as silent as in a section.
        unknown = sorted(str(key) for key in set(section) - KNOWN_FILE_KEYS)
        if unknown:
            raise ConfigError(unknown[0], "unknown agent setting")
        defaults = cls()
        tls_file = _file_subsection(section, "tls", TLS_FILE_KEYS)
        push_file = _file_subsection(section, COLLECTOR_TLS, COLLECTOR_TLS_FILE_KEYS)
        collector_tls = ClientTlsConfig(
            ca=resolve(f"{COLLECTOR_TLS}.ca", collector_ca, ENV_COLLECTOR_CA, push_file,
                       None, str),
            cert=resolve(f"{COLLECTOR_TLS}.cert", collector_cert, ENV_COLLECTOR_CERT,
                         push_file, None, str),
            key=resolve(f"{COLLECTOR_TLS}.key", collector_key, ENV_COLLECTOR_KEY, push_file,
                        None, str),
            setting=COLLECTOR_TLS,
        )
        tls = TlsConfig.from_sources(tls_cert, tls_key, tls_client_ca, tls_file)

        def duration(key: str, default: float) -> float:
            return float(resolve_typed(key, None, None, section, default, "duration",
                                       DURATION_FILE_KEYS[key]))

        def integer(key: str, default: int) -> int:
            return int(resolve_typed(key, None, None, section, default, "int"))

        config = cls(
            listen=resolve("listen", listen, ENV_LISTEN, section, DEFAULT_LISTEN, str),
            collector_url=resolve("collector", collector_url, ENV_COLLECTOR, section,
                                  None, str),
            interval_seconds=resolve_typed("interval_seconds", interval, ENV_INTERVAL, section,
                                           DEFAULT_INTERVAL_SECONDS, "duration", "interval",
                                           argument_key="interval"),
            engine_metrics_urls=resolve("engine_metrics",
                                        tuple(engine_metrics_urls) if engine_metrics_urls
                                        else None,
                                        ENV_ENGINE_METRICS, section, (), _url_list),
            node=resolve("node", node, ENV_NODE, section, defaults.node, str),
            engine_timeout_seconds=duration("engine_timeout_seconds",
                                            DEFAULT_ENGINE_TIMEOUT_SECONDS),
            engine_interval_seconds=duration("engine_interval_seconds",
                                             DEFAULT_ENGINE_INTERVAL_SECONDS),
            push_timeout_seconds=duration("push_timeout_seconds", DEFAULT_PUSH_TIMEOUT_SECONDS),
            push_interval_seconds=duration("push_interval_seconds", DEFAULT_PUSH_INTERVAL_SECONDS),
            nic_source=cast(NicSource, resolve("nic_source", None, None, section, "auto", str)),
            nic_exclude=resolve("nic_exclude", None, None, section, DEFAULT_NIC_EXCLUDE, str),
            sysfs_root=resolve("sysfs_root", None, None, section, str(DEFAULT_SYSFS_ROOT), str),
            pcie_throughput=resolve_typed("pcie_throughput", None, None, section, True, "bool"),
            nvml_retry_seconds=duration("nvml_retry_seconds", DEFAULT_NVML_RETRY_SECONDS),
            max_devices=integer("max_devices", DEFAULT_MAX_DEVICES),
            max_models=integer("max_models", DEFAULT_MAX_MODELS),
            max_sources=integer("max_sources", DEFAULT_MAX_SOURCES),
            kv_events=resolve("kv_events", tuple(kv_events) if kv_events else None,
                              ENV_KV_EVENTS, section, (), _url_list),
            kv_event_models=_engine_map("kv_event_models",
                                        section.get("kv_event_models") or {}),
            kv_events_replay=_engine_map("kv_events_replay",
                                         section.get("kv_events_replay") or {}),
            kv_max_blocks=integer("kv_max_blocks", DEFAULT_MAX_BLOCKS),
            tls=tls,
            collector_tls=collector_tls,
        )
        return config.validate()


# Duration settings: the file key ends in _seconds; the short key before it still works.
DURATION_FILE_KEYS: Final = {
    "interval_seconds": "interval", "engine_timeout_seconds": "engine_timeout",
    "engine_interval_seconds": "engine_interval", "push_timeout_seconds": "push_timeout",
    "push_interval_seconds": "push_interval", "nvml_retry_seconds": "nvml_retry",
}
KNOWN_FILE_KEYS: Final = frozenset({
    "listen", "collector", "engine_metrics", "node", "nic_source", "nic_exclude",
    "sysfs_root", "pcie_throughput", "max_devices", "max_models", "max_sources", "tls",
    "kv_events", "kv_event_models", "kv_events_replay", "kv_max_blocks",
    "collector_tls", *DURATION_FILE_KEYS, *DURATION_FILE_KEYS.values(),
})
TLS_FILE_KEYS: Final = frozenset({"cert", "key", "client_ca"})
COLLECTOR_TLS: Final = "collector_tls"
COLLECTOR_TLS_FILE_KEYS: Final = frozenset({"ca", "cert", "key"})


def _file_subsection(section: Mapping[str, Any], name: str,
                     known: frozenset[str]) -> dict[str, Any]:
    """The ``name`` mapping of the agent's file section, keyed ``name.key`` as resolve()
    reads it; unknown keys are errors naming them."""
    raw = section.get(name) or {}
    if not isinstance(raw, Mapping):
        raise ConfigError(name, "must be a mapping")
    unknown = sorted(str(key) for key in set(raw) - known)
    if unknown:
        raise ConfigError(f"{name}.{unknown[0]}", "unknown setting")
    return {f"{name}.{key}": value for key, value in raw.items() if value is not None}


def _check_url(url: str, key: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(key, f"expected an http(s) URL, got {url!r}")
