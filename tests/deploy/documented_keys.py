"""Allow-lists of documented configuration keys, for checking configs that cannot run here
(no docker): the Compose Specification's top-level and service keys, and the OpenTelemetry
Collector's configuration structure with the components the stack uses (otlp receiver,
batch and memory_limiter processors, loadbalancing/otlp/otlphttp exporters, health_check).
Sources: compose-spec (spec.md), opentelemetry.io/docs/collector/configuration, the
component READMEs in opentelemetry-collector and opentelemetry-collector-contrib."""

from __future__ import annotations

from typing import Any

COMPOSE_TOP_LEVEL = {"version", "name", "services", "networks", "volumes", "configs",
                     "secrets", "include"}
COMPOSE_SERVICE = {
    "image", "build", "command", "entrypoint", "environment", "env_file", "ports", "expose",
    "volumes", "depends_on", "restart", "user", "read_only", "healthcheck", "networks",
    "network_mode", "labels", "deploy", "cap_add", "cap_drop", "security_opt", "tmpfs",
    "extra_hosts", "secrets", "configs", "container_name", "working_dir", "ulimits",
    "logging", "privileged", "devices", "runtime", "shm_size", "stop_grace_period",
}
COMPOSE_SECRET = {"file", "environment", "external", "name"}

OTEL_TOP_LEVEL = {"receivers", "processors", "exporters", "extensions", "connectors",
                  "service"}
OTEL_SERVICE = {"extensions", "pipelines", "telemetry"}
OTEL_PIPELINE = {"receivers", "processors", "exporters"}
OTEL_PIPELINE_TYPES = {"traces", "metrics", "logs"}

_GRPC_SERVER = {"endpoint", "transport", "tls", "max_recv_msg_size_mib", "keepalive",
                "auth", "max_concurrent_streams", "read_buffer_size", "write_buffer_size"}
_HTTP_SERVER = {"endpoint", "tls", "cors", "auth", "max_request_body_size",
                "include_metadata", "traces_url_path", "metrics_url_path", "logs_url_path"}
_OTLP_CLIENT = {"endpoint", "tls", "timeout", "compression", "headers", "retry_on_failure",
                "sending_queue", "balancer_name", "auth", "keepalive", "write_buffer_size",
                "wait_for_ready"}
_TLS_CLIENT = {"insecure", "insecure_skip_verify", "ca_file", "cert_file", "key_file",
               "server_name_override", "min_version"}

# Component type -> allowed keys; a nested dict gives the allowed keys one level down.
OTEL_COMPONENTS: dict[str, dict[str, Any]] = {
    "receivers.otlp": {"protocols": {"grpc": _GRPC_SERVER, "http": _HTTP_SERVER}},
    "processors.batch": {"send_batch_size": None, "send_batch_max_size": None,
                         "timeout": None, "metadata_keys": None,
                         "metadata_cardinality_limit": None},
    "processors.memory_limiter": {"check_interval": None, "limit_mib": None,
                                  "spike_limit_mib": None, "limit_percentage": None,
                                  "spike_limit_percentage": None},
    "exporters.loadbalancing": {
        "routing_key": None, "routing_attributes": None, "timeout": None,
        "retry_on_failure": None, "sending_queue": None,
        "protocol": {"otlp": {**dict.fromkeys(_OTLP_CLIENT), "tls": _TLS_CLIENT}},
        "resolver": {"static": {"hostnames"},
                     "dns": {"hostname", "port", "interval", "timeout"},
                     "k8s": {"service", "ports", "timeout", "return_hostnames"},
                     "aws_cloud_map": {"namespace", "service_name", "port", "interval",
                                       "timeout", "health_status"}},
    },
    "exporters.otlp": dict.fromkeys(_OTLP_CLIENT),
    "exporters.otlphttp": dict.fromkeys(_OTLP_CLIENT | {"traces_endpoint",
                                                        "metrics_endpoint",
                                                        "logs_endpoint", "encoding"}),
    "extensions.health_check": {"endpoint": None, "path": None, "check_collector_pipeline":
                                None},
}
LOADBALANCING_ROUTING_KEYS = {"traceID", "service", "resource", "metric", "streamID",
                              "attributes"}


def _check_keys(value: Any, allowed: Any, where: str, errors: list[str]) -> None:
    if allowed is None or not isinstance(value, dict):
        return
    if isinstance(allowed, set):
        allowed = dict.fromkeys(allowed)
    for key, sub in value.items():
        if key not in allowed:
            errors.append(f"{where}.{key}: not a documented key")
        else:
            _check_keys(sub, allowed[key], f"{where}.{key}", errors)


def otel_config_errors(config: dict[str, Any]) -> list[str]:
    """Undocumented keys, unknown components and dangling pipeline references."""
    errors: list[str] = []
    for key in config:
        if key not in OTEL_TOP_LEVEL:
            errors.append(f"{key}: not a top-level section")
    for section in OTEL_TOP_LEVEL - {"service"}:
        for component_id, settings in (config.get(section) or {}).items():
            kind = component_id.split("/", 1)[0]
            allowed = OTEL_COMPONENTS.get(f"{section}.{kind}")
            if allowed is None:
                errors.append(f"{section}.{component_id}: component not in the allow-list")
                continue
            _check_keys(settings or {}, allowed, f"{section}.{component_id}", errors)
            if kind == "loadbalancing":
                routing = (settings or {}).get("routing_key", "traceID")
                if routing not in LOADBALANCING_ROUTING_KEYS:
                    errors.append(f"{section}.{component_id}.routing_key: {routing!r}")
                resolvers = (settings or {}).get("resolver") or {}
                if len(resolvers) != 1:
                    errors.append(f"{section}.{component_id}.resolver: exactly one needed")
    service = config.get("service") or {}
    _check_keys(service, dict.fromkeys(OTEL_SERVICE), "service", errors)
    for extension in service.get("extensions", []):
        if extension not in (config.get("extensions") or {}):
            errors.append(f"service.extensions: {extension} not defined")
    for pipeline_id, pipeline in (service.get("pipelines") or {}).items():
        if pipeline_id.split("/", 1)[0] not in OTEL_PIPELINE_TYPES:
            errors.append(f"service.pipelines.{pipeline_id}: unknown signal")
        _check_keys(pipeline, dict.fromkeys(OTEL_PIPELINE), f"pipelines.{pipeline_id}",
                    errors)
        for section in OTEL_PIPELINE:
            for component in pipeline.get(section, []):
                if component not in (config.get(section) or {}):
                    errors.append(f"pipelines.{pipeline_id}.{section}: {component} undefined")
        if not pipeline.get("receivers") or not pipeline.get("exporters"):
            errors.append(f"pipelines.{pipeline_id}: needs receivers and exporters")
    return errors


def compose_errors(compose: dict[str, Any]) -> list[str]:
    errors: list[str] = []
    for key in compose:
        if key not in COMPOSE_TOP_LEVEL:
            errors.append(f"{key}: not a top-level Compose key")
    services = compose.get("services") or {}
    for name, service in services.items():
        for key in service:
            if key not in COMPOSE_SERVICE:
                errors.append(f"services.{name}.{key}: not a documented service key")
        if "image" not in service and "build" not in service:
            errors.append(f"services.{name}: needs image or build")
        for dependency in service.get("depends_on", []):
            if dependency not in services:
                errors.append(f"services.{name}.depends_on: {dependency} undefined")
        for secret in service.get("secrets", []):
            if secret not in (compose.get("secrets") or {}):
                errors.append(f"services.{name}.secrets: {secret} undefined")
        if "network_mode" in service and ("ports" in service or "networks" in service):
            errors.append(f"services.{name}: network_mode excludes ports/networks")
    for name, secret in (compose.get("secrets") or {}).items():
        for key in secret:
            if key not in COMPOSE_SECRET:
                errors.append(f"secrets.{name}.{key}: not a documented key")
    return errors
