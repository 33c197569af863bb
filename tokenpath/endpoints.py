"""Default listen addresses and endpoints, one place (docs/security.md: loopback by default).

Every listener binds the loopback interface unless told otherwise; the collector takes
OTLP/gRPC on 4317 and OTLP/HTTP (and its API, UI and /metrics) on 4318, the OTLP
defaults; the agent serves /metrics on 9400.
"""

from __future__ import annotations

from typing import Final

LOOPBACK: Final = "127.0.0.1"
COLLECTOR_GRPC_PORT: Final = 4317
COLLECTOR_HTTP_PORT: Final = 4318
AGENT_PORT: Final = 9400

COLLECTOR_GRPC: Final = f"{LOOPBACK}:{COLLECTOR_GRPC_PORT}"
COLLECTOR_HTTP: Final = f"{LOOPBACK}:{COLLECTOR_HTTP_PORT}"
COLLECTOR_URL: Final = f"http://{COLLECTOR_HTTP}"
AGENT_LISTEN: Final = f"{LOOPBACK}:{AGENT_PORT}"


def host_port(host: str, port: int) -> str:
    """``host:port`` as a URL or a gRPC target writes it: an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
