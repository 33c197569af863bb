"""``tokenpath agent``: the node agent."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import typer

from tokenpath.cli.common import auth_token, console, fail
from tokenpath.config import ConfigError, load_config_file
from tokenpath.endpoints import AGENT_LISTEN

if TYPE_CHECKING:
    from tokenpath.agent.service import AgentService

FORMATS = ("text", "json")


def register(app: typer.Typer) -> None:
    @app.command("agent")
    def agent(
        listen: str | None = typer.Option(
            None, help=f"HOST:PORT for GET /metrics and /healthz (default {AGENT_LISTEN})."),
        collector: str | None = typer.Option(
            None, help="Collector OTLP/HTTP base URL; metrics are pushed to URL/v1/metrics."),
        interval: str | None = typer.Option(
            None, help="Seconds between polls: 1, 500ms, 2s (default 1)."),
        engine_metrics: list[str] = typer.Option(
            [], help="Engine /metrics URL, vLLM or SGLang (repeatable)."),
        node: str | None = typer.Option(None, help="Node name (default: the hostname)."),
        kv_events: list[str] = typer.Option(
            [], help="[ENGINE_ID=]tcp://HOST:PORT: a ZeroMQ endpoint the node's engines "
            "publish KV-cache events to (repeatable; the agent binds it)."),
        config: Path | None = typer.Option(
            None, help="YAML config file (settings under `agent:`)."),
        auth_token_file: Path | None = typer.Option(
            None, help="File holding the bearer token (else TOKENPATH_AUTH_TOKEN)."),
        tls_cert: str | None = typer.Option(None, help="PEM server certificate: /metrics "
                                            "over TLS (with --tls-key)."),
        tls_key: str | None = typer.Option(None, help="PEM private key of --tls-cert."),
        tls_client_ca: str | None = typer.Option(None, help="PEM CA: require client "
                                                 "certificates signed by it (mTLS)."),
        collector_ca: str | None = typer.Option(None, help="PEM CA that signed an https "
                                                "collector's certificate (default: the "
                                                "system's CA store)."),
        collector_cert: str | None = typer.Option(None, help="PEM client certificate for a "
                                                  "collector that requires one (mTLS)."),
        collector_key: str | None = typer.Option(None, help="PEM key of --collector-cert."),
        once: bool = typer.Option(False, "--once", help="Take one poll, print it, exit."),
        output_format: str = typer.Option(
            "text", "--format", help="Output of --once: text or json."),
    ) -> None:
        """Sample NVML GPU/HBM, NIC counters and engine /metrics on this node."""
        from tokenpath.agent.config import AgentConfig
        from tokenpath.agent.service import AgentService

        if output_format not in FORMATS:
            fail(f"--format: expected one of {', '.join(FORMATS)}, got {output_format!r}")
        try:
            agent_config = AgentConfig.from_sources(
                listen=listen, collector_url=collector, interval=interval,
                engine_metrics_urls=engine_metrics, node=node, kv_events=kv_events,
                tls_cert=tls_cert,
                tls_key=tls_key, tls_client_ca=tls_client_ca, collector_ca=collector_ca,
                collector_cert=collector_cert, collector_key=collector_key,
                file_values=load_config_file(config),
            )
        except ConfigError as exc:
            fail(f"agent config: {exc}")
        token = auth_token(auth_token_file)
        service = AgentService(agent_config, auth_token=token)
        if once:
            _print_once(service, output_format)
            return
        stop = threading.Event()

        def _on_signal(signum: int, frame: FrameType | None) -> None:
            del signum, frame
            stop.set()

        signal.signal(signal.SIGTERM, _on_signal)
        signal.signal(signal.SIGINT, _on_signal)
        try:
            service.start()
        except OSError as exc:
            service.shutdown()
            fail(f"--listen {agent_config.listen}: {exc.strerror or exc}")
        except ConfigError as exc:
            service.shutdown()
            fail(f"agent config: {exc}")
        service.settle_heap()
        nvml = service.nvml_sampler
        console.print(
            f"tokenpath agent on {service.metrics_url} "
            f"(node {agent_config.node}, every {agent_config.interval_seconds:g}s, "
            f"nvml_up {1 if nvml.up else 0}"
            + (f": {nvml.init_error}" if nvml.init_error else "") + ")",
            highlight=False, markup=False,
        )
        if agent_config.collector_url:
            console.print(f"pushing OTLP metrics to {agent_config.collector_url}/v1/metrics",
                          highlight=False, markup=False)
        try:
            # No timeout: the signal handler wakes this wait, and an idle agent should
            # wake only to poll (on a shared VM every wake-up costs cold caches).
            stop.wait()
        finally:
            service.shutdown()


def _print_once(service: AgentService, output_format: str) -> None:
    try:
        snapshot = service.poll_once()
        nvml = service.nvml_sampler
        if output_format == "json":
            payload = {
                "node": service.config.node,
                "nvml_up": nvml.up,
                "nvml_error": nvml.init_error,
                "gpu_names": {str(k): v for k, v in nvml.device_names().items()},
                **snapshot.to_json(),
            }
            print(json.dumps(payload, indent=2, sort_keys=True))
        else:
            for series, points in snapshot.to_json()["metrics"].items():
                for point in points:
                    labels = ",".join(f'{k}="{v}"' for k, v in point["labels"].items())
                    print(f"{series}{{{labels}}} {point['value']:g}" if labels
                          else f"{series} {point['value']:g}")
    finally:
        service.shutdown()
