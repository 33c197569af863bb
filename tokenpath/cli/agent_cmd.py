"""``tokenpath agent``: the node agent (issue 5/9)."""

from __future__ import annotations

import typer

from tokenpath.cli.common import not_yet_available


def register(app: typer.Typer) -> None:
    @app.command("agent")
    def agent(
        listen: str = typer.Option("127.0.0.1:9400", help="HOST:PORT for GET /metrics."),
        collector: str | None = typer.Option(None, help="Collector OTLP/HTTP base URL."),
        interval: float = typer.Option(1.0, help="Seconds between polls."),
        engine_metrics: list[str] = typer.Option([], help="Engine /metrics URL (repeatable)."),
    ) -> None:
        """Sample NVML GPU/HBM, NIC counters and engine /metrics on this node."""
        not_yet_available("agent", "5/9")
